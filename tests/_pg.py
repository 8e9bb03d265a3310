"""A PostgreSQL database reached through a login role whose password appears nowhere else, for
tests that prove no output carries the password (builds on conftest's ``pg_url``)."""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa


@pytest.fixture
def pg_secret_url(pg_url):
    """(url, password): ``pg_url``'s database, owned by a fresh role with a random password.
    Where the test role may not create roles, the same user with a random password (the
    servers of `.ci/postgres.sh` trust 127.0.0.1, so the password is not checked there)."""
    password = f"pw-{uuid.uuid4().hex}"
    role = f"leak_{uuid.uuid4().hex[:10]}"
    url = sa.engine.make_url(pg_url)
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    created = False
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            c.exec_driver_sql(f"GRANT ALL ON DATABASE {url.database} TO {role}")
            c.exec_driver_sql(f"GRANT ALL ON SCHEMA public TO {role}")
            c.exec_driver_sql(f"GRANT {role} TO CURRENT_USER")  # so the cleanup may end its sessions
        created = True
        secret = url.set(username=role, password=password)
    except sa.exc.ProgrammingError:  # no CREATEROLE
        secret = url.set(password=password)
    yield secret.render_as_string(hide_password=False), password
    from autotune.core import _store

    eng = _store._engines.pop(secret.render_as_string(hide_password=False), None)
    if eng is not None:
        eng.dispose()
    admin.dispose()
    if created:  # the database first (its sessions are the role's), then the role
        base = sa.create_engine(os.environ["AUTOTUNE_TEST_PG_URL"], isolation_level="AUTOCOMMIT")
        with base.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {url.database} WITH (FORCE)")
            c.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        base.dispose()
