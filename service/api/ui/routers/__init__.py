"""One router per dashboard page (see `service.api.ui.PAGE_ROUTERS`)."""
