"""DBBench fixtures: the SQLite backend, and a MariaDB backend shared by the whole session.

MariaDB: `HSJAX_MARIADB_URL` (e.g. `mysql://root@localhost/?unix_socket=/run/mysqld/mysqld.sock`)
selects an existing server; otherwise a local socket-only `mariadbd` is started when the binary is
installed (.ci/install_mariadb.sh). Without it the MariaDB tests are skipped, and reported as
skipped; with `HSJAX_REQUIRE_MARIADB=1` (set in CI) they fail instead.
"""
import os

import pytest

from harness_envs.dbbench import make_backend
from harness_envs.dbbench import mariadb_server


def _mariadb_or_skip():
    url = os.environ.get("HSJAX_MARIADB_URL")
    if url is None and not mariadb_server.is_available():
        message = f"MariaDB not available: {mariadb_server.INSTALL_HINT}"
        if os.environ.get("HSJAX_REQUIRE_MARIADB") == "1":
            pytest.fail(message + " (HSJAX_REQUIRE_MARIADB=1)")
        pytest.skip(message)
    return make_backend("mariadb", url=url)


@pytest.fixture(scope="session")
def mariadb_backend():
    backend = _mariadb_or_skip()
    yield backend
    backend.close()


@pytest.fixture(params=["sqlite", "mariadb"])
def backend(request):
    """Each test using this runs on both backends."""
    return request.getfixturevalue(f"{request.param}_backend")
