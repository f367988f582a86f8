"""The chart's RBAC grants the operator everything it calls (tests/operator_rbac.py lists it
exactly); the operator integration tests run under the same RBAC and see no 403."""

from __future__ import annotations

import pytest
from helm_binary import render_chart
from k8s_emulator import service_account
from operator_rbac import (
    GRANTED_ELSEWHERE,
    KEDA_NEEDS,
    OPERATOR_NEEDS,
    refused,
    with_operator_access,
)

RELEASE = "jobpool-system"
ACCOUNT = "jp-jobpool"


@pytest.mark.parametrize("values", [
    (), ("--set", "operator.watchNamespaces={mdm}"), ("--set", "rbac.keda=true"),
], ids=["cluster-wide", "one-namespace", "keda"])
def test_the_chart_grants_what_the_operator_calls(helm: str, values: tuple[str, ...]) -> None:
    keda = "rbac.keda=true" in values
    objects = with_operator_access(render_chart(helm, *values), keda)
    operator = service_account(objects, RELEASE, ACCOUNT)
    needs = OPERATOR_NEEDS + (KEDA_NEEDS if keda else ())
    assert refused(operator, needs, release=RELEASE, pools="mdm") == []


def test_access_added_for_the_tests_is_access_the_chart_lacks(helm: str) -> None:
    # each entry of GRANTED_ELSEWHERE must still be missing from the chart: once the chart
    # grants one, it goes from the list
    chart = service_account(render_chart(helm, "--set", "rbac.keda=true"), RELEASE, ACCOUNT)
    for need in GRANTED_ELSEWHERE:
        assert refused(chart, [need], release=RELEASE, pools="mdm"), need
