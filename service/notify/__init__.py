"""Notifications without I/O on the database: which webhook addresses are allowed
(`addresses`), how deliveries are signed and verified (`signing`), what a delivery's body looks like
(`bodies`) and when a failed one is tried again (`retry`). The store writes the outbox
(`service.store.webhooks`), the dispatcher process delivers it (`workers.notify`)."""
