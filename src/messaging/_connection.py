"""One call from the YAML file that ``projections run`` reads to a ready database."""

from __future__ import annotations

import os

from messaging._bounds import answer_bound
from messaging._config import load_settings
from messaging._settings import Settings
from messaging.store._database import Database

__all__ = ["connect", "database_for"]


def database_for(settings: Settings, *, bounded: bool = True) -> Database:
    """The database the settings name, with their tenant and table prefix (not prepared).
    Its MySQL/MariaDB connections wait for an answer at most the bound of the settings'
    stale-instance-timeout (:func:`~messaging.store._database.answer_bound`), or for ever
    when not ``bounded`` (migrations)."""
    stale = settings.messaging.consumer.stale_instance_timeout
    answer_timeout = answer_bound(stale) if bounded else None
    return Database(
        settings.database,
        tenant=settings.tenant,
        table_prefix=settings.table_prefix,
        answer_timeout=answer_timeout,
    )


def connect(
    config: str | os.PathLike[str] | None = None, *, database: str | None = None
) -> Database:
    """The database of a deployment, as ``projections run --config CONFIG`` sees it: its
    URL (``database``, else ``$PROJECTIONS_DATABASE_URL``, else the file's, else
    ``sqlite:///projections.db``), tenant and table prefix, prepared (the schema created
    on SQLite, checked on MySQL; the tenant's position counter made) so that appends work
    on a fresh database. The caller disposes of it (``db.dispose()``).

    Raises :class:`~messaging._errors.ConfigError` for a bad file or setting and
    :class:`~messaging._errors.SchemaError` for a MySQL schema that is not migrated.
    """
    db = database_for(load_settings(config, database=database))
    try:
        db.prepare()
    except BaseException:
        db.dispose()
        raise
    return db
