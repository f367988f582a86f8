"""Every jobpool connection notices a vanished server within about a minute."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from jobpool.db.connect import TCP_LIVENESS, with_tcp_liveness


def test_a_dsn_without_tcp_settings_gets_keepalives_and_a_user_timeout() -> None:
    params = conninfo_to_dict(with_tcp_liveness("postgresql://app@db.example:5432/mdm"))
    assert {name: params[name] for name in TCP_LIVENESS} == TCP_LIVENESS
    assert params["host"] == "db.example" and params["dbname"] == "mdm"


def test_settings_in_the_dsn_win() -> None:
    params = conninfo_to_dict(with_tcp_liveness("host=db keepalives_idle=5 tcp_user_timeout=0"))
    assert params["keepalives_idle"] == "5" and params["tcp_user_timeout"] == "0"
    assert params["keepalives_count"] == TCP_LIVENESS["keepalives_count"]
