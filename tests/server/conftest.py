from tests.server.procs import fresh_postgres

__all__ = ["fresh_postgres"]
