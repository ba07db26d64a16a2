"""Measurement shim, not a port: with CONVEYOR_MC_DRIVER=mysqldb, a `conveyor
worker` process gets mysqlclient (MySQLdb) connections where Conveyor's MySQL
backend asks pymysql.connect for one. Errors are NOT translated (a deadlock
would not be retried): fit for a one-worker drain on a quiet queue only."""

import os
import sys

if os.environ.get("CONVEYOR_MC_DRIVER") == "mysqldb" and "worker" in sys.argv:
    import MySQLdb
    import MySQLdb.cursors
    import pymysql

    def _connect(**kw):
        kw.pop("cursorclass", None)
        kw["connect_timeout"] = max(1, int(kw.get("connect_timeout", 10)))
        return MySQLdb.connect(cursorclass=MySQLdb.cursors.DictCursor, **kw)

    pymysql.connect = _connect
    print("[mc_shim] worker on mysqlclient", file=sys.stderr)
