"""The chart's RBAC grants the operator everything it calls (tests/operator_rbac.py lists it
exactly); the operator integration tests run under the same RBAC and see no 403."""

from __future__ import annotations

import pytest
from helm_binary import render_chart
from k8s_emulator import service_account
from operator_rbac import KEDA_NEEDS, OPERATOR_NEEDS, refused

RELEASE = "jobpool-system"
ACCOUNT = "jp-jobpool"


@pytest.mark.parametrize("values", [
    (), ("--set", "operator.watchNamespaces={mdm}"), ("--set", "rbac.keda=true"),
], ids=["cluster-wide", "one-namespace", "keda"])
def test_the_chart_grants_what_the_operator_calls(helm: str, values: tuple[str, ...]) -> None:
    keda = "rbac.keda=true" in values
    objects = render_chart(helm, *values)
    operator = service_account(objects, RELEASE, ACCOUNT)
    needs = OPERATOR_NEEDS + (KEDA_NEEDS if keda else ())
    assert refused(operator, needs, release=RELEASE, pools="mdm") == []

