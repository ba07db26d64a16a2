"""Property-based fuzzing of every operation in /openapi.json with schemathesis,
on both backends: whatever it sends, the server answers without a 5xx.
Bounded: a few dozen examples per operation, derandomized (the same run every
time), well under a minute per backend."""

from __future__ import annotations

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

EXAMPLES = 25


def test_no_operation_answers_with_a_server_error(start_server, producer):
    admin = producer.create_token("admin", name="fuzz")[1]
    for n in range(3):  # something for ids 1..n to name
        producer.enqueue("fuzz", [n], tenant="t")
    server = start_server("--app", "tests.server.srvapp:app", "--max-wait", "0.2")
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    headers = {"Authorization": f"Bearer {admin}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    statuses: dict[int, int] = {}
    assert len(operations) > 40

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case):
            if case.operation.path.endswith("/events"):
                # a live stream never ends: its answer is its status (checks, then
                # the stream opens) and the first bytes
                kwargs = case.as_transport_kwargs(base_url=server.url, headers=headers)
                with requests.request(**kwargs, stream=True, timeout=30) as r:
                    assert r.status_code < 500, (case.path, r.status_code)
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                return
            response = case.call(base_url=server.url, headers=headers, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        fuzz()
    assert "Traceback" not in server.log.read_text()
    # it got through: most calls were accepted or refused on their merits, not on auth
    assert sum(n for status, n in statuses.items() if status < 300) > 300
    assert statuses.get(401, 0) == statuses.get(403, 0) == 0
