"""Where a table's log files are read from, each source with the same small interface (`dir`, `exists`,
`modified`, `read`, `first_line`, `names`, `table_file_exists`, and `parquet` where Python reads): plain file calls for
a local table, pyarrow's file systems for object storage, Spark's Hadoop file system for the rest; and
`TableLog`, which picks one for a table: Python for local tables and S3 where pyarrow reaches it, so
that a poll and the table's metadata need no JVM.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from cdc2ch.base.log import get_logger
from cdc2ch.model.objectstore import S3Settings, connector_of
from cdc2ch.model.tableref import is_local
from cdc2ch.source.deltalog.commitlog import DeltaLog, missing_table, not_a_delta_table
from cdc2ch.source.storefaults import storage_error


class HadoopLogFiles:
    """Log files through the Spark session's Hadoop FileSystem: the same connectors and credentials as
    Spark's own reads, for every storage Spark can reach."""

    def __init__(self, spark, uri: str):
        jvm = spark._jvm
        # Every dotted lookup through the py4j gateway is a round trip: resolve the classes once.
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._IOUtils = jvm.org.apache.commons.io.IOUtils
        self._URI = jvm.java.net.URI
        self.dir = uri.rstrip("/") + "/_delta_log/"
        conf = spark._jsparkSession.sessionState().newHadoopConf()  # includes session-level fs.* settings
        self._fs, self._conf = self._Path(self.dir).getFileSystem(conf), conf

    def _path(self, name: str):
        return self._Path(self.dir + name)

    def exists(self, name: str) -> bool:
        return self.modified(name) is not None

    def modified(self, name: str) -> int | None:
        try:
            return self._fs.getFileStatus(self._path(name)).getModificationTime()
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return None
            raise

    def read(self, name: str) -> str | None:
        try:
            stream = self._fs.open(self._path(name))
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                return None
            raise
        try:
            return self._IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def first_line(self, name: str) -> str | None:
        text = self.read(name)
        return None if text is None else text.split("\n", 1)[0]

    def names(self) -> list[str]:
        return [status.getPath().getName() for status in self._fs.listStatus(self._path(""))]

    def table_file_exists(self, path: str) -> bool | None:
        """Whether the table's file `path` (as the log writes it: a URI relative to the table, or absolute) is
        in storage, resolved as Delta resolves it; None when that cannot be told."""
        try:
            file = self._Path(self._Path(self.dir[: -len("_delta_log/")]), self._Path(self._URI(path)))
            return bool(file.getFileSystem(self._conf).exists(file))
        except Exception:
            return None


def s3_filesystem(s3: S3Settings):
    """pyarrow's S3 file system with the endpoint and keys Spark is given, not only the environment's."""
    import pyarrow.fs as pafs

    options: dict[str, Any] = s3.arrow_options()
    return pafs.S3FileSystem(**options)


class ArrowLogFiles:
    """Log files through pyarrow's file systems, without a JVM: local paths, and object stores with their
    standard credential chains (S3 with the endpoint and keys Spark is given too, GCS, Azure)."""

    SCHEMES = {"": "", "file": "file", "s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfs": "abfs",
               "abfss": "abfss"}  # fmt: skip

    def __init__(self, uri: str, s3: S3Settings | None = None):
        import pyarrow.fs as pafs

        parts = urlsplit(uri)
        scheme = parts.scheme
        if scheme not in self.SCHEMES:
            raise ValueError(f"no Python file system for {scheme}:// URIs")
        self._fs: pafs.FileSystem
        self._s3 = self.SCHEMES[scheme] == "s3"
        if self._s3:
            self._fs, root = s3_filesystem(s3 or S3Settings()), parts.netloc + parts.path
        elif scheme:
            self._fs, root = pafs.FileSystem.from_uri(uri)
        else:  # a path, not a URI: a space, '#' or '?' in it is part of the name
            self._fs, root = pafs.LocalFileSystem(), os.path.abspath(uri)
        self.dir = root.rstrip("/") + "/_delta_log/"
        self._pafs = pafs

    def exists(self, name: str) -> bool:
        """Whether the log holds `name`: on S3 one HEAD, where a file's info asks a LIST too when the file is
        not there (is it a directory?), which every poll with nothing new would pay."""
        if not self._s3:
            return self.modified(name) is not None
        try:
            self._fs.open_input_file(self.dir + name).close()
        except FileNotFoundError:
            return False
        return True

    def modified(self, name: str) -> int | None:
        info = self._fs.get_file_info(self.dir + name)
        if info.type == self._pafs.FileType.NotFound:
            return None
        return int(cast("int", info.mtime_ns) // 1_000_000)  # a file's: the stores read report it

    def read(self, name: str) -> str | None:
        try:
            with self._fs.open_input_stream(self.dir + name) as stream:
                return stream.read().decode("utf-8")
        except FileNotFoundError:
            return None

    def parquet(self, name: str, columns: list[str]):
        """Those of `columns` a log file in Parquet (a checkpoint) has, as a pyarrow Table."""
        import pyarrow.parquet as pq

        with self._fs.open_input_file(self.dir + name) as f:
            found = pq.ParquetFile(f)
            return found.read(columns=[c for c in columns if c in found.schema_arrow.names])

    def first_line(self, name: str, chunk: int = 64 * 1024) -> str | None:
        """The file's first line, reading no further than needed (a commit file can hold megabytes)."""
        try:
            with self._fs.open_input_stream(self.dir + name) as stream:
                head = b""
                while b"\n" not in head:
                    more = stream.read(chunk)
                    if not more:
                        break
                    head += more
        except FileNotFoundError:
            return None
        return head.split(b"\n", 1)[0].decode("utf-8")

    def names(self) -> list[str]:
        selector = self._pafs.FileSelector(self.dir, allow_not_found=True)
        return [info.base_name for info in self._fs.get_file_info(selector)]

    def table_file_exists(self, path: str) -> bool | None:
        """Whether the table's file `path` (relative to the table, URI-encoded) is in storage; None for an
        absolute path, which this reader does not resolve."""
        if urlsplit(path).scheme or path.startswith("/"):
            return None
        info = self._fs.get_file_info(self.dir[: -len("_delta_log/")] + unquote(path))
        return info.type != self._pafs.FileType.NotFound


class LocalLogFiles:
    """A local table's log read with plain file calls (the interface of HadoopLogFiles and
    ArrowLogFiles): a poll is a few system calls, with no JVM and no Arrow file system loaded. A file the log
    names by an absolute URI is resolved as Delta resolves it, through Spark (`hadoop` builds that)."""

    def __init__(self, uri: str, hadoop: Callable[[], HadoopLogFiles]):
        parts = urlsplit(uri)
        root = unquote(parts.path) if parts.scheme == "file" else os.path.abspath(uri)
        self.root, self.dir = root.rstrip("/") + "/", root.rstrip("/") + "/_delta_log/"
        self._hadoop = hadoop
        self._through_spark: HadoopLogFiles | None = None

    def exists(self, name: str) -> bool:
        return self.modified(name) is not None

    def modified(self, name: str) -> int | None:
        try:
            return os.stat(self.dir + name).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None

    def read(self, name: str) -> str | None:
        try:
            with open(self.dir + name, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def first_line(self, name: str) -> str | None:
        try:
            with open(self.dir + name, "rb") as f:
                return f.readline().rstrip(b"\n").decode("utf-8")
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        try:
            return os.listdir(self.dir)
        except FileNotFoundError:
            return []

    def parquet(self, name: str, columns: list[str]):
        """Those of `columns` a log file in Parquet (a checkpoint) has, as a pyarrow Table."""
        import pyarrow.parquet as pq

        found = pq.ParquetFile(self.dir + name)
        return found.read(columns=[c for c in columns if c in found.schema_arrow.names])

    def table_file_exists(self, path: str) -> bool | None:
        if not urlsplit(path).scheme and not path.startswith("/"):
            return os.path.exists(self.root + unquote(path))
        if self._through_spark is None:
            self._through_spark = self._hadoop()
        return self._through_spark.table_file_exists(path)


def python_log(uri: str, files=None, name: str | None = None, s3: S3Settings | None = None) -> DeltaLog:
    """The table's log read by Python, without a JVM, its latest version found. ValueError or OSError when
    Python cannot reach this storage (a scheme pyarrow has no file system for, or credentials it cannot
    find; `s3`: the S3 settings, by default the environment's); SourceError when there is no Delta table at
    `uri` (`name`: the catalog's name for it).

    The search starts at the last checkpoint (or version 0) and probes a few files: the log is listed only
    when it has neither, so a long log costs no more than a short one."""
    files = files or ArrowLogFiles(uri, s3)
    log = DeltaLog(files)
    try:
        log.latest_version()
    except FileNotFoundError:  # no commit file at all
        if is_local(uri) and not os.path.exists(files.dir[: -len("/_delta_log/")] or "/"):
            raise missing_table(uri, name) from None
        raise not_a_delta_table(uri, name) from None
    return log


class TableLog:
    """One table's log and the files it is read from: by Python where Python reaches them (local disk
    always; S3 when pyarrow does), else through Spark's Hadoop file system. `spark` starts the
    session when the log must be read through it; `s3` gives the S3 settings Spark is given."""

    def __init__(
        self, location: str, name: str | None, spark: Callable[[], Any], s3: Callable[[], S3Settings]
    ):
        self.location, self.name = location, name
        self._spark, self._s3 = spark, s3
        self.local = is_local(location)
        # None: not tried yet. Only S3 among object stores: its settings are the ones Spark is given (the
        # others' Python clients would look for credentials on their own, metadata servers included).
        self._by_python: bool | None = (
            True if self.local else None if connector_of(location) == "s3" else False
        )
        self.log: DeltaLog | None = None
        self.files: LocalLogFiles | ArrowLogFiles | HadoopLogFiles | None = None

    def by_python(self) -> bool:
        """Whether the log is read by Python: tried once for a table on object storage. A refusal that
        names its cause (credentials, bucket, endpoint) is the answer; Spark would meet the same."""
        if self._by_python is None:
            try:
                files = ArrowLogFiles(self.location, self._s3())
                self.log, self.files = python_log(self.location, files, self.name), files
                self._by_python = True
            except (ValueError, OSError) as exc:
                refused = storage_error(str(exc), self.location, "the Delta log")
                if refused is not None:
                    raise refused from None
                get_logger("cdc2ch.source").debug(f"reading the log of {self.location} through Spark: {exc}")
                self._by_python = False
        return self._by_python

    def get(self, check: Callable[[], None]) -> DeltaLog:
        """The log, opened on first use; `check` refuses a location Spark finds no Delta table at."""
        if self.log is None and not self.by_python():
            check()
            self.files = HadoopLogFiles(self._spark(), self.location)
            self.log = DeltaLog(self.files)
        if self.log is None:  # local
            local = LocalLogFiles(self.location, lambda: HadoopLogFiles(self._spark(), self.location))
            self.log, self.files = python_log(self.location, local, self.name), local
        return self.log
