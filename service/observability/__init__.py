"""The service's own observability: structured logs (`logs`), the job and dispatcher metrics every process
counts (`counters`), how a registry is shown to a scrape (`exposition`), and the per-transition log line and
observations that `service.store.states.transition` records (`transitions`). See docs/observability.md."""
