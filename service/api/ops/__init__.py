"""The service layer: one function per operation, between the transports and the store.

The API's routes (`service.api.routers`) and the dashboard's pages (`service.api.ui`) call these
functions, as a CLI command that works in process would (the CLI's commands go through the HTTP
API today); a route or a page only reads its request, calls one, and renders what it returns.

Each function takes plain inputs (the sessionmaker, the caller's `Principal`, a validated body, the
settings values it needs), never a request, opens its own transactions, and returns the API's
output model or raises what the API answers: `ApiError`, or the store's `NotFound`/`Conflict`, which
`service.api.errors` renders as 404/409. So every transport applies the same checks, visibility and
words, and the dashboard imports no route module.

The submit path, which the batch route and the request gate's shortcut share too, is
`service.api.submission`.
"""
