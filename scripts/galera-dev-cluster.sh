#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on loopback for development (the one the tests use):
#   scripts/galera-dev-cluster.sh start|stop|status|kill N|restart N|destroy [--directory DIR]
# SQL on 127.0.0.1:4406-4408; point the framework at all three nodes with
#   database: mysql://root@127.0.0.1:4406,127.0.0.1:4407,127.0.0.1:4408/test
set -euo pipefail
exec python3 "$(dirname "$0")/../tests/support/galera_cluster.py" "$@"
