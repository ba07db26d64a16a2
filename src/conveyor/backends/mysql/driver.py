"""The MySQL driver a backend's connections are made with: PyMySQL (pure Python,
the default) or mysqlclient (``MySQLdb``, the MariaDB client library in C), chosen
by the URL's ``driver`` option. Both are DB-API modules with the same parameter
style, error classes and codes, and dict cursors; what differs between them is
here. mysqlclient spends 42% less of a worker's CPU per job (bench/lab), which on
a MariaDB drain is about a fifth more jobs a second."""

from __future__ import annotations

import importlib
import math
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

from ...errors import ConfigError

#: the URL's ``driver=`` values
DRIVERS = ("pymysql", "mysqlclient")
#: rowcount = rows matched, as on PostgreSQL and SQLite (not only those changed);
#: the same flag in both drivers' CLIENT constants
FOUND_ROWS = 2


@dataclass(frozen=True)
class Driver:
    """One driver's module and its dict cursor."""

    name: str
    module: Any
    dict_cursor: Any

    @property
    def Error(self) -> type[Exception]:
        error: type[Exception] = self.module.Error
        return error

    @property
    def OperationalError(self) -> type[Exception]:
        error: type[Exception] = self.module.OperationalError
        return error

    @property
    def InterfaceError(self) -> type[Exception]:
        error: type[Exception] = self.module.InterfaceError
        return error

    def connect(self, kwargs: dict[str, Any]) -> Any:
        """A connection in autocommit, utf8mb4, dict rows, rowcount as rows matched."""
        if self.name == "mysqlclient":
            # whole seconds in libmariadb (a bound below one second waits one)
            kwargs = {**kwargs, "connect_timeout": max(1, math.ceil(kwargs["connect_timeout"]))}
        return self.module.connect(
            **kwargs,
            charset="utf8mb4",
            autocommit=True,
            cursorclass=self.dict_cursor,
            client_flag=FOUND_ROWS,
        )

    def ping(self, conn: Any) -> None:
        """Raises the driver's error if the server does not answer (never reconnects:
        a new session would lose the old one's settings)."""
        if self.name == "mysqlclient":
            conn.ping()
        else:
            conn.ping(reconnect=False)

    def set_socket_options(self, conn: Any, options: list[tuple[int, int, int]]) -> None:
        """``setsockopt`` on the connection's TCP socket (none on a Unix socket)."""
        if self.name == "mysqlclient":
            # a socket object over a duplicate of libmariadb's descriptor: the
            # options are the socket's, which both descriptors share
            with socket.socket(fileno=os.dup(conn.fileno())) as dup:
                _set_options(dup, options)
        else:
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                _set_options(sock, options)


def _set_options(sock: socket.socket, options: list[tuple[int, int, int]]) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    for level, name, value in options:
        try:
            sock.setsockopt(level, name, value)
        except OSError:
            pass


PYMYSQL = Driver("pymysql", pymysql, pymysql.cursors.DictCursor)


def driver(name: str) -> Driver:
    """The driver a URL's ``driver=`` names."""
    if name == "pymysql":
        return PYMYSQL
    if name != "mysqlclient":
        raise ConfigError(
            f"MySQL URL option driver must be one of {', '.join(DRIVERS)}, got {name!r}"
        )
    try:
        cursors = importlib.import_module("MySQLdb.cursors")  # (no type stubs)
    except ImportError as exc:
        raise ConfigError(
            "MySQL URL option driver=mysqlclient needs the mysqlclient package: "
            "pip install 'conveyor[mysqlclient]' (it builds against the MariaDB or MySQL "
            "client library: apt-get install libmariadb-dev pkg-config)"
        ) from exc
    return Driver("mysqlclient", sys.modules["MySQLdb"], cursors.DictCursor)


def errors() -> tuple[type[Exception], ...]:
    """Every loaded driver's base error: for code that closes or resets a
    connection of either driver."""
    found: list[type[Exception]] = [pymysql.Error]
    mysqldb = sys.modules.get("MySQLdb")
    if mysqldb is not None:
        found.append(mysqldb.Error)
    return tuple(found)
