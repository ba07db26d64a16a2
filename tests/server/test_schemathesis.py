"""Property-based fuzzing of every operation in /openapi.json with schemathesis,
on every backend, with all of schemathesis' checks: no 5xx, and every answer
is one the document describes (its status, content type, headers and body
schema); requests the schema allows are not refused as malformed, requests it
forbids are refused. Positive and negative examples; bounded (a few per
operation), derandomized (the same run every time)."""

from __future__ import annotations

from collections import Counter

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

EXAMPLES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 5}
CONFIG = SchemathesisConfig.from_str(
    """
# Query parameters a route does not know are ignored, as HTTP APIs do (the
# document does not forbid them): not a request to refuse.
generation.allow-extra-parameters = false

# 422 is the documented answer to values the schema allows but the server does
# not take, which JSON Schema cannot state: a queue that does not exist, a time
# past ten years from now, a name that is not printable, NUL in an argument, a
# bulk filter with no field.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422"]

# asyncflow's protocol (flowsvr compatibility) answers a refused request with
# HTTP 200 and a non-zero code; and it parses the body before it checks the
# token, so a malformed body without one gets that answer too, not a 401.
[[operations]]
include-path-regex = "^/api/"
checks.negative_data_rejection.enabled = false
checks.ignored_auth.enabled = false
"""
)


def test_every_operation_passes_every_check(start_server, producer):
    admin = producer.create_token("admin", name="fuzz")[1]
    for n in range(3):  # something for ids 1..n to name
        producer.enqueue("fuzz", [n], tenant="t")
    server = start_server("--app", "tests.server.srvapp:app", "--max-wait", "0.2")
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json", config=CONFIG)
    headers = {"Authorization": f"Bearer {admin}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    seen: dict[GenerationMode, Counter[int]] = {mode: Counter() for mode in EXAMPLES}
    assert len(operations) > 40

    for operation in operations:
        for mode, statuses in seen.items():
            try:
                fuzz(operation, mode, server.url, headers, statuses)
            except Unsatisfiable:
                # an operation without parameters or body has no invalid request
                assert mode == GenerationMode.NEGATIVE, operation.label
    total = sum(seen.values(), Counter())
    print(f"schemathesis: {total.total()} requests, statuses {dict(sorted(total.items()))}")
    assert "Traceback" not in server.log.read_text()
    assert not [status for status in total if status >= 500]
    # it got through: most valid calls were accepted or refused on their merits, not
    # on auth (negative examples may leave the token out)
    positive = seen[GenerationMode.POSITIVE]
    assert sum(n for status, n in positive.items() if status < 300) > 200
    assert positive[401] == positive[403] == 0


def fuzz(operation, mode: GenerationMode, url: str, headers: dict, statuses: Counter[int]):
    """``EXAMPLES[mode]`` requests to ``operation``, each answer checked."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case):
        if case.operation.path.endswith("/events"):
            # a live stream never ends: its answer is its status (checks, then the
            # stream opens) and the first bytes
            kwargs = case.as_transport_kwargs(base_url=url, headers=headers)
            with requests.request(**kwargs, stream=True, timeout=30) as r:
                statuses[r.status_code] += 1
                documented = case.operation.definition.raw["responses"]
                assert str(r.status_code) in documented, (case.path, r.status_code)
            return
        response = case.call(base_url=url, headers=headers, timeout=30)
        statuses[response.status_code] += 1
        case.validate_response(response, headers=headers)

    run()
