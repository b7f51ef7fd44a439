"""Files only the service's user reads.

The database, its -wal and -shm, its backups and the key file show every webhook URL, the cursor key
and (with the key file) every webhook secret. A umask of 077 makes everything this process creates
from then on readable by its own user only: files 0600, folders 0700 (SQLite gives a -wal and -shm
its database's mode, which the umask bounds too). Files an earlier release made world-readable lose
those permissions at the next start. A folder is tightened only when the caller names it as the
service's own: the database may sit in a shared one (/tmp) whose mode is not ours to change.
"""

import logging
import os
import stat

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077
SQLITE_COMPANIONS = ("-wal", "-shm", ".lock")


def keep_private(database_file: str | None = None, *own_paths: str) -> None:
    """From now on create files and folders for this process's user only; and take every permission
    of group and others from the SQLite `database_file` with its companions, and from `own_paths`
    (the key file, the instance folder), those that exist. One that cannot be changed is named in a
    WARNING; the service still starts."""
    os.umask(PRIVATE_UMASK)
    paths = [database_file + suffix for suffix in ("", *SQLITE_COMPANIONS)] if database_file else []
    for path in [*paths, *own_paths]:
        _tighten(path)


def _tighten(path: str) -> None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & PRIVATE_UMASK:
            os.chmod(path, mode & ~PRIVATE_UMASK)
    except FileNotFoundError:
        pass
    except OSError as error:  # another owner's file, a read-only file system
        log.warning("%s stays readable by other users (%s): make it readable by the service's user only",
                    path, error.strerror)
