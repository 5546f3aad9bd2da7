"""A Kubernetes attempt's logs, read from its pods through the API (`GET .../pods/<pod>/log`).

- Sources: the attempt's pods (`shardctl.dev/name=<name>`), in node order (the completion index, or the
  Kubeflow replica type and index), each pod's first container (the one the backend renders). A pod
  log holds stdout and stderr together (stream `output`); torchrun tees each rank's lines there behind
  `[rank<r>]:` (`render`), so each line gets its global rank; its own lines have none (rank None).
- Cursors: per pod, the second of the last line read and how many bytes of the timestamped log lie
  from that second to the end of that line. A read asks for `timestamps=true&sinceTime=<that second>`
  (the API's sinceTime has second precision) and skips those bytes, so resuming neither repeats nor
  drops lines that share a timestamp (the mistake of polling by timestamp alone).
- At most `MAX_READ` new bytes per pod per read (`limitBytes`); a line cut by that limit waits for the
  next read, unless it alone is longer (then it is cut).
- Artifacts: the output folder is a pod-local volume the service cannot read (`OutputsUnavailable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.joblogs import (
    BadCursor,
    LogChunk,
    LogLine,
    OutputsUnavailable,
    decode_cursor,
    encode_cursor,
    split_rank,
)
from workers.backends.kubernetes.client import KubeClient
from workers.backends.kubernetes.naming import COMPLETION_INDEX, LABEL_NAME, POD, SELECTOR

MAX_READ = 256 * 1024
#: Bytes a cursor may skip within one second; more is a forged cursor (the API server parses limitBytes as int64).
MAX_SKIP = 1 << 48
NO_ARTIFACTS = ("artifacts are not available on Kubernetes: the job's output folder is a volume inside its pods"
                " that this server cannot read; copy them from the pods (kubectl cp) or write them to storage"
                " the job reaches")
_KUBEFLOW_TYPE = "training.kubeflow.org/replica-type"
_KUBEFLOW_INDEX = "training.kubeflow.org/replica-index"


def _node_order(pod: dict[str, Any]) -> tuple[int, int, str]:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    index = str(labels.get(COMPLETION_INDEX) or annotations.get(COMPLETION_INDEX) or "")
    kubeflow = str(labels.get(_KUBEFLOW_INDEX) or "")
    if not index and kubeflow.isdigit():
        return 0 if labels.get(_KUBEFLOW_TYPE) == "master" else 1, int(kubeflow), str(meta.get("name"))
    return 0, int(index) if index.isdigit() else 0, str(meta.get("name"))


def attempt_pods(kube: KubeClient, ns: str, k8s: str) -> list[dict[str, Any]]:
    """The attempt's pods, in node order."""
    return sorted(kube.list(POD, ns, f"{SELECTOR},{LABEL_NAME}={k8s}"), key=_node_order)


def _second(ts: str) -> str:
    """The whole second of an RFC 3339 timestamp, as `sinceTime` takes it."""
    return ts.partition(".")[0].rstrip("Z") + "Z"


def _positions(cursor: str | None) -> dict[str, tuple[str, int]]:
    state = decode_cursor(cursor)
    out: dict[str, tuple[str, int]] = {}
    for pod, value in state.items():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                and isinstance(value[1], int) and not isinstance(value[1], bool) and 0 <= value[1] <= MAX_SKIP):
            raise BadCursor("not a cursor of this job's pod logs: pass back a `cursor` or `next_cursor` as sent")
        out[pod] = (value[0], value[1])
    return out


def _encode(positions: dict[str, tuple[str, int]]) -> str:
    return encode_cursor({pod: [second, size] for pod, (second, size) in positions.items()})


def read_pod_logs(kube: KubeClient, pods: Sequence[dict[str, Any]], *, rank: int | None, cursor: str | None,
                  limit: int, finished: bool) -> LogChunk:
    """At most `limit` lines after `cursor` from `pods` (of `rank` only when given). `finished`: the
    attempt had ended before this call; the chunk is then finished once every pod is read to its end.

    A pod's position is the second of the last line read and the bytes of the timestamped log from
    that second up to the end of that line: the next read asks for `sinceTime=<second>` and skips
    exactly those bytes (a log only grows), so lines that share a timestamp are neither repeated nor lost."""
    positions = _positions(cursor)
    lines: list[LogLine] = []
    drained = True
    for pod in pods:
        if len(lines) >= limit:
            drained = False
            break
        meta = pod.get("metadata") or {}
        name, ns = str(meta.get("name")), str(meta.get("namespace"))
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        second, skip = positions.get(name, ("", 0))
        query = {"timestamps": "true", "limitBytes": str(skip + MAX_READ)}
        if containers[0].get("name"):
            query["container"] = str(containers[0]["name"])
        if second:
            query["sinceTime"] = second
        text = kube.pod_log(ns, name, query)
        data = (text or "").encode()
        full = len(data) >= skip + MAX_READ
        data = data[skip:]
        end = data.rfind(b"\n") + 1
        if full and end == 0:
            end = len(data)  # one line longer than a read: cut it
        elif not full and finished:
            end = len(data)
        for raw in data[:end].splitlines(keepends=True):
            ts, _, body = raw.decode(errors="replace").rstrip("\r\n").partition(" ")
            if _second(ts) == second:
                skip += len(raw)
            else:
                second, skip = _second(ts), len(raw)
            positions[name] = (second, skip)
            line_rank, body = split_rank(body)
            if rank is not None and line_rank != rank:
                continue
            lines.append(LogLine(rank=line_rank, stream="output", line=body, cursor=_encode(positions)))
            if len(lines) >= limit:
                break
        if full or positions.get(name, ("", 0))[1] != skip or len(lines) >= limit:
            drained = False
    return LogChunk(lines=lines, next_cursor=_encode(positions), finished=finished and drained)


def no_artifacts() -> OutputsUnavailable:
    return OutputsUnavailable(NO_ARTIFACTS)
