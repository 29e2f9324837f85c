"""The frontend's Prometheus metrics, recorded where each event happens (common.metrics.CONTRACT lists them).

With several uvicorn processes prometheus-client runs in multiprocess mode (frontend/server.py sets
PROMETHEUS_MULTIPROC_DIR), so counters and histograms add up over the processes and each gauge
combines as its contract entry says.
"""

from __future__ import annotations

from quiver.common.metrics import Children, define

REQUESTS = define("quiver_requests_total")
FAILURES = define("quiver_request_failures_total")
STAGE_SECONDS = define("quiver_request_stage_seconds")
INPUT_TOKENS = define("quiver_request_input_tokens")
INPUTS = define("quiver_request_inputs")
INFLIGHT_TOKENS = define("quiver_frontend_inflight_tokens")
LIVE_WORKERS = define("quiver_frontend_live_workers")
SCORE_FIRST_SHARE = define("quiver_frontend_score_first_share")
CHUNKS_SENT = define("quiver_frontend_chunks_sent_total")
CHUNKS_RESENT = define("quiver_frontend_chunks_resent_total")
BUSY_POLL_SECONDS = define("quiver_frontend_busy_poll_seconds_total")
BAD_MESSAGES = define("quiver_frontend_bad_messages_total")
OTHER_MODEL_NAMES = define("quiver_frontend_other_model_names_total")
CONNECTIONS_CUT = define("quiver_frontend_connections_cut_total")
WARMUP_REQUESTS = define("quiver_frontend_warmup_requests_total")

# The children every request records into, by label values: (route, status, model), (route, reason),
# (route, stage, model), route.
REQUESTS_BY = Children(REQUESTS)
FAILURES_BY = Children(FAILURES)
STAGE_SECONDS_BY = Children(STAGE_SECONDS)
INPUT_TOKENS_BY = Children(INPUT_TOKENS)
INPUTS_BY = Children(INPUTS)
CUT_REASONS = ("header_timeout", "header_too_large", "too_many_connections")
for _reason in CUT_REASONS:
    CONNECTIONS_CUT.labels(_reason)  # every reason exported from the start, at 0
