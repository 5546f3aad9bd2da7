"""Backends: where jobs run. One module per backend behind the protocol in `base.py`."""
