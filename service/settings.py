"""Configuration from `SHARDCTL_*` environment variables."""

from __future__ import annotations

import ipaddress
import os
from functools import cached_property
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.backend_options import BackendKind


class Settings(BaseSettings):
    """The service's settings. SQLite under `data_dir` unless `database_url` names another database."""

    model_config = SettingsConfigDict(env_prefix="SHARDCTL_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("shardctl")))
    database_url: str | None = Field(None, description="e.g. postgresql+psycopg://user@host/db")
    max_body_bytes: int = 1 << 20
    max_upload_bytes: int = Field(
        2 << 30, gt=0, description="Largest request body of one trace upload, all its files together (2 GiB)."
        " Each file is also limited to SHARDCTL_MAX_TRACE_BYTES.")
    max_streams: int = Field(256, ge=1, description="Live event streams one API process serves at once; one"
                             " more is a 429.")
    max_streams_per_token: int = Field(16, ge=1, description="Live event streams one token holds open at once;"
                                       " one more is a 429.")
    max_log_followers: int = Field(64, ge=1, description="Live log streams (GET /v1/jobs/{id}/logs?follow=true)"
                                   " one API process serves at once; one more is a 429.")
    logs_poll_s: float = Field(0.5, gt=0, le=60, description="How often a live log stream reads the backend.")
    logs_heartbeat_s: float = Field(15.0, gt=0, le=300, description="A live log stream with nothing new sends"
                                    " a comment this often (proxies close idle connections).")
    max_artifact_bytes: int = Field(16 << 20, ge=0, description="Largest artifact GET /v1/jobs/{id}/artifacts/{path}"
                                    " sends (16 MiB); a larger one is a 409 naming its size.")
    profile_workers: int = Field(1, ge=1, le=64, description="Trace analyses run at once (each holds at most"
                                 " max_trace_events events of one rank in memory).")
    profile_queue: int = Field(4, ge=0, le=1024, description="Uploads waiting for an analysis; one more is a 503.")
    max_profiles_per_job: int = Field(64, ge=1, description="Profile summaries one job may hold (posted or"
                                      " analysed from uploads); one more is a 409.")
    max_trace_bytes: int = Field(512 << 20, gt=0, description="Largest trace file one upload may carry.")
    max_trace_events: int = Field(4_000_000, gt=0, description="Complete events analysed per rank (bounds memory).")
    events_poll_s: float = 0.5
    public_url: str = Field("http://127.0.0.1:8686", description="Where jobs reach the API for callbacks. Unset,"
                            " `shardctl serve --with-dispatcher` uses its own --host and --port (this machine's"
                            " hostname when --host is a wildcard such as 0.0.0.0); set it behind a proxy or a"
                            " Service.")
    dispatcher_interval_s: float = 1.0
    dispatcher_lease_s: float = 60.0
    dispatcher_batch: int = 16
    max_attempts: int = 3
    retry_backoff_s: float = 5.0
    backends: list[BackendKind] | None = Field(
        None, description="The backend kinds this installation's dispatchers run (SHARDCTL_BACKENDS='[\"slurm\"]')."
        " A spec for another is refused at submit. Default: those this host can run (local; slurm when sbatch"
        " is on PATH; kubernetes with a kubeconfig). Set it when the API and the dispatchers run on different hosts.")
    planner_workers: int = Field(
        2, ge=1, le=64, description="Threads that plan specs for POST /v1/plans and /v1/jobs, apart from the"
        " request threads. A request that finds them all busy waits planner_wait_s, then gets a 503.")
    shortcut_threads: int = Field(
        3, ge=1, le=256, description="Requests the request gate's shortcuts work on at once in one API"
        " process: this many of a job's and a list's reads and heartbeats, and as many submissions; the rest"
        " wait their turn in the order they came. A process runs Python on one core at a time: more threads"
        " than its statements keep waiting on the database only take turns on the lock. Raise it for a"
        " database far away, or for statements that wait on locks.")
    planner_budget_s: float = Field(
        10.0, gt=0, le=600, description="Time budget of one layout search; a search that runs past it"
        " stops and the request gets a 422 plan_too_costly.")
    calibration_min_runs: int = Field(
        5, ge=1, le=10_000, description="Measured runs of one GPU kind and layout family before its calibration"
        " factors are used by plans (docs/planner.md, \"Calibration\"); below it the model's figures stand.")
    calibration_scope: Literal["team", "all"] = Field(
        "team", description="Whose measured runs calibrate a plan: `team`, the submitting team's own (one"
        " team's reports never move another team's plans); `all`, every team's, one fit for all (set it only"
        " when every team's jobs are trusted: a job's program can post any report).")
    planner_wait_s: float = Field(
        0.5, ge=0, le=60, description="How long a request waits for a free planning thread before the"
        " 503 (with Retry-After).")
    local_devices: str | None = Field(None, description="What the local backend hands out instead of what it"
                                      " detects: 'gpu:0,1,2,3' (or '0,1,2,3': CUDA_VISIBLE_DEVICES ids), 'cpu:0-3'"
                                      " (CPU ids for affinity), or both joined by ';'. Unset: the GPUs"
                                      " $CUDA_VISIBLE_DEVICES or `nvidia-smi -L` names, and this process's CPUs.")
    local_run_as: str | None = Field(None, description="An OS user the local backend runs every job's processes"
                                     " as (the server must run as root; the runs folder under SHARDCTL_DATA_DIR"
                                     " must be reachable by that user). Unset: jobs run as the server's own user,"
                                     " which can read the server's files: single-tenant (docs/security.md).")
    kubeconfig: Path | None = None
    kubernetes_namespace: str = "default"
    kubernetes_namespaces: list[str] = Field(default_factory=list, description="Other namespaces specs may name.")
    kubernetes_default_image: str | None = None
    kubernetes_queues: dict[str, str] = Field(default_factory=dict, description="team -> Kueue LocalQueue")
    job_token_grace_s: float = Field(300.0, ge=0, description="How long a job's token keeps working after the job"
                                     " ends (for its final report); then it expires.")
    metrics_token: SecretStr | None = Field(
        None, description="When set, /metrics needs 'Authorization: Bearer <this>' (or an admin token); unset,"
        " /metrics is open.")
    metrics_team_labels: bool = Field(False, description="Label /metrics series by team (names every team and"
                                      " its job counts to whoever may scrape); off: totals only.")
    # Logs and the dispatcher's own metrics (docs/observability.md).
    log_format: Literal["text", "json"] = Field(
        "text", description="Process logs: 'text' (one readable line) or 'json' (one JSON object per line: ts,"
        " level, logger, message, fields).")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="The least severe level logged (case-insensitive).")
    dispatcher_metrics_port: int | None = Field(
        None, ge=0, le=65535, description="When set, `shardctl worker` serves its own Prometheus metrics (queue"
        " wait, attempts and failures, cycle time, deliveries) on this port; unset, it serves none.")
    dispatcher_metrics_host: str = Field("127.0.0.1", description="Interface of the dispatcher's metrics port.")
    # Running as a server (docs/server.md).
    shutdown_grace_s: float = Field(20.0, gt=0, le=3600, description="On SIGTERM, how long serve lets requests"
                                    " in flight finish and `serve --with-dispatcher` or `worker` lets the current"
                                    " dispatcher cycle end, before it stops anyway (leases it still holds are"
                                    " given back). Keep it under the supervisor's own kill timeout.")
    # Connections serve holds open (docs/server.md, "Connections and slow clients"). Each API process
    # counts its own.
    header_timeout_s: float = Field(
        10.0, gt=0, le=300, description="SHARDCTL_HEADER_TIMEOUT_S: how long a client has to send a request's"
        " headers, counted from when its connection opens and, on a kept-alive connection, from the first byte"
        " of each later request; then serve closes the connection. Request bodies and responses are not timed.")
    keepalive_timeout_s: float = Field(
        5.0, gt=0, le=3600, description="SHARDCTL_KEEPALIVE_TIMEOUT_S: how long serve keeps a connection open"
        " with nothing to do between two requests.")
    max_connections_per_client: int = Field(
        64, ge=0, description="SHARDCTL_MAX_CONNECTIONS_PER_CLIENT: open connections one client address may"
        " hold to one API process; another is answered 503 and closed before it is read. 0: no per-client cap."
        " Exempt a reverse proxy that carries many clients with SHARDCTL_CONNECTION_CAP_EXEMPT.")
    connection_cap_exempt: list[str] = Field(
        default_factory=list, description="SHARDCTL_CONNECTION_CAP_EXEMPT: addresses or CIDRs the per-client"
        " cap does not apply to (a reverse proxy, an ingress controller, a NAT gateway), e.g."
        " '[\"127.0.0.1/32\"]'.")
    max_connections: int | None = Field(
        None, ge=1, description="SHARDCTL_MAX_CONNECTIONS: open connections one API process holds in all; another"
        " is answered 503 and closed before it is read. Unset: 4096. Either way it is lowered to the process's"
        " open-file limit (ulimit -n) less what the database, logs and dispatcher need (256 descriptors, at"
        " most half the limit); a value set here that is lowered is said at start.")
    bootstrap_admin_token: SecretStr | None = Field(
        None, description="When set, serve makes sure an admin token with exactly this value exists (idempotent;"
        " never logged). Its form is a shardctl token, shc_<id>_<secret>: id 8 to 32 letters and digits, secret"
        " 32 to 200 of [A-Za-z0-9_-]; e.g. python -c \"import secrets; print('shc_' + secrets.token_hex(8) + '_'"
        " + secrets.token_urlsafe(32))\".")
    ui_session_idle_s: float = Field(
        7200.0, gt=0, le=30 * 86400, description="A dashboard session ends after this long without a page"
        " request (live updates on an open page do not count); then the person signs in again.")
    ui_session_max_s: float = Field(
        43200.0, gt=0, le=365 * 86400, description="A dashboard session ends this long after sign-in, however"
        " active it is.")
    forwarded_auth: bool = Field(False, description="Trust user and group headers from an authenticating proxy"
                                 " (oauth2-proxy...) at the addresses in forwarded_trusted_proxies. Off: those"
                                 " headers are ignored entirely.")
    forwarded_user_header: str = Field("X-Forwarded-User", min_length=1, description="The proxy's user header.")
    forwarded_groups_header: str = Field("X-Forwarded-Groups", min_length=1, description="The proxy's groups"
                                         " header (comma-separated group names).")
    forwarded_trusted_proxies: list[str] = Field(
        default_factory=list, description="Addresses or CIDRs of the proxies whose forwarded headers are trusted,"
        " e.g. '[\"10.0.0.0/8\", \"127.0.0.1\"]'. A request from any other address has its forwarded headers"
        " ignored.")
    forwarded_admin_groups: list[str] = Field(default_factory=list, description="Groups whose forwarded users act"
                                              " as admin.")
    forwarded_team_groups: dict[str, str] = Field(
        default_factory=dict, description="group -> team: a forwarded user in one of these groups is a member"
        " of that team (created on first use), e.g. '{\"ml-vision\": \"vision\"}'.")

    @field_validator("forwarded_trusted_proxies", "connection_cap_exempt")
    @classmethod
    def _networks(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{info.field_name}: {item!r} is not an IP address or CIDR"
                                 " (e.g. 10.0.0.0/8, 127.0.0.1)") from None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value
    # Webhooks (docs/notifications.md).
    webhook_allow_private: bool = Field(False, description="Allow webhook URLs on loopback, private and link-local"
                                        " addresses (single-machine installs, tests). Off: refused.")
    webhook_timeout_s: float = Field(10.0, gt=0, le=120, description="Connect and read timeout of one delivery.")
    webhook_concurrency: int = Field(8, ge=1, le=256, description="Deliveries one dispatcher process makes at once.")
    webhook_retry_base_s: float = Field(2.0, gt=0, description="Delay before the first retry; doubles each attempt"
                                        " (with jitter) up to webhook_retry_max_s.")
    webhook_retry_max_s: float = Field(3600.0, gt=0, description="Longest delay between two attempts.")
    webhook_retry_horizon_s: float = Field(86400.0, gt=0, description="How long a delivery is retried before it"
                                           " is given up (default 24 h).")
    webhook_secret_grace_s: float = Field(86400.0, ge=0, description="After a rotation, how long the previous"
                                          " secret still signs deliveries beside the new one.")
    webhook_poll_s: float = Field(1.0, gt=0, description="How often the delivery worker looks for due deliveries.")
    # Shared GPUs: pools, quotas, admission (docs/scheduling.md, "Operating pools and quotas").
    pools_file: Path | None = Field(None, description="A YAML file of pools and team quotas (SHARDCTL_POOLS_FILE),"
                                    " loaded by serve and worker at start (its pools and quotas replace those an"
                                    " earlier load of a file wrote; those declared through the API stay).")
    local_gpus: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}:[0-9]{1,7}$",
                                   description="What the local machine has, instead of detecting it with nvidia-smi:"
                                   " KIND:COUNT, e.g. H100-SXM-80GB:8 or cpu:4 (SHARDCTL_LOCAL_GPUS).")
    usage_half_life_h: float = Field(168.0, gt=0, le=100_000, description="Half-life of past usage in the"
                                     " fair-share order, hours (Slurm's PriorityDecayHalfLife).")
    usage_blend: float = Field(0.5, ge=0, le=1, description="Weight of decayed past usage against current use"
                               " in the fair-share order (0: current use only).")
    min_runtime_s: float = Field(600.0, ge=0, description="A running job younger than this is never preempted.")
    queue_view_max_age_s: float = Field(60.0, ge=0, description="explain answers a waiting job from the dispatcher's"
                                        " queue view while it is at most this old, else computes it live (0: always"
                                        " live).")

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            url = self.database_url
            if url.startswith("postgresql://") or url.startswith("postgres://"):
                url = "postgresql+psycopg://" + url.split("://", 1)[1]
            return url
        return f"sqlite:///{self.data_dir / 'shardctl.db'}"


class SettingsError(ValueError):
    """A setting from the environment that does not validate: one line per bad setting, naming its
    environment variable (`load_settings`)."""


def load_settings() -> Settings:
    """`Settings()` from the environment, or `SettingsError` saying which `SHARDCTL_*` variable is
    wrong and why (instead of pydantic's traceback)."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            name = "SHARDCTL_" + str(error["loc"][0]).upper() if error["loc"] else "SHARDCTL_*"
            value = os.environ.get(name)
            secret = any(word in name for word in ("TOKEN", "URL", "SECRET", "PASSWORD", "KEY", "CREDENTIAL", "AUTH"))
            shown = f" (it is {value!r})" if value is not None and not secret else ""
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"{name}{shown}: {message}; fix it or unset it (docs/server.md lists the settings)")
        raise SettingsError("\n".join(lines)) from None
