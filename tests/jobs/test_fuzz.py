"""Fuzz the Batch API: any body, form or batch input line gets a 2xx or 4xx, never a 5xx, and a batch of
random lines still completes with one result line per input line."""

from __future__ import annotations

import json
import time

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)), max_leaves=15)
batch_bodies = st.one_of(json_values, st.fixed_dictionaries({}, optional={
    "input_file_id": st.one_of(st.text(max_size=30), json_scalars), "endpoint": st.sampled_from(
        ["/v1/embeddings", "/v1/rerank", "/score", "/v1/chat/completions", 7]),
    "completion_window": st.sampled_from(["24h", "0h", "1h", "99999h", "", None]), "metadata": json_values}))
request_bodies = st.fixed_dictionaries({}, optional={
    "input": st.one_of(st.text(max_size=80), st.lists(st.text(max_size=30), max_size=4),
                       st.lists(st.integers(-5, 40000), max_size=8), json_values),
    "model": st.one_of(st.none(), st.text(max_size=12)), "dimensions": st.one_of(st.none(), st.integers(-3, 500)),
    "encoding_format": st.sampled_from(["float", "base64", "int8", "bogus"]), "truncate": json_scalars})
lines = st.one_of(st.text(max_size=60).filter(lambda t: "\n" not in t and "\r" not in t),
                  st.builds(lambda cid, body, url: json.dumps({"custom_id": cid, "method": "POST", "url": url,
                                                               "body": body}),
                            st.text(min_size=1, max_size=8), request_bodies,
                            st.sampled_from(["/v1/embeddings", "/v1/embeddings", "/score"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=batch_bodies, path=st.sampled_from(["/v1/batches", "/v1/files", "/v1/batches/x/cancel"]))
def test_no_body_gets_a_5xx(jobs_cluster, body, path):
    response = httpx.post(jobs_cluster.url + path, json=body, timeout=60)
    assert response.status_code < 500, (path, body, response.status_code, response.text[:300])
    assert "error" in response.json() or response.status_code == 200


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(form=st.dictionaries(st.sampled_from(["purpose", "expires_after[seconds]", "other"]),
                            st.text(max_size=12), max_size=3), content=st.binary(max_size=400))
def test_no_upload_gets_a_5xx(jobs_cluster, form, content):
    response = httpx.post(jobs_cluster.url + "/v1/files", data=form, files={"file": ("x.jsonl", content)}, timeout=60)
    assert response.status_code < 500, (form, content, response.status_code, response.text[:300])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_lines=st.lists(lines, min_size=1, max_size=12))
def test_a_batch_of_random_lines_completes_with_a_line_per_request(jobs_cluster, random_lines):
    url = jobs_cluster.url
    content = "\n".join(random_lines).encode()
    uploaded = httpx.post(url + "/v1/files", data={"purpose": "batch"}, files={"file": ("r.jsonl", content)})
    if uploaded.status_code != 200:  # only blank lines: refused as empty
        assert uploaded.status_code == 400 and not any(line.encode().strip() for line in random_lines)
        return
    batch = httpx.post(url + "/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings",
                                                  "completion_window": "24h"}).json()
    end = time.monotonic() + 120
    while batch["status"] not in ("completed", "failed"):
        assert time.monotonic() < end, batch
        time.sleep(0.2)
        batch = httpx.get(f"{url}/v1/batches/{batch['id']}").json()
    assert batch["status"] == "completed"
    counts = batch["request_counts"]
    total = sum(1 for line in random_lines if line.encode().strip())  # the server's blank: ASCII whitespace
    assert counts["total"] == total and counts["completed"] + counts["failed"] == total
    written = 0
    for key in ("output_file_id", "error_file_id"):
        if batch[key]:
            # JSONL lines end with "\n"; str.splitlines would also break inside a custom_id holding U+0085 or U+2028
            text = httpx.get(f"{url}/v1/files/{batch[key]}/content").text
            written += sum(1 for line in text.split("\n") if line)
    assert written == total
    assert jobs_cluster.health().status_code == 200
