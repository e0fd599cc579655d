"""``projections messages check``: every stored (topic, type, payload version), how many
messages have it, and whether the registered upcasters lead it to a current class.

One ``GROUP BY`` read from the index ``ix_messages_shape`` (tenant, topic, type,
payload_version), so the rows themselves are never read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from messaging import Database, DecodeError, RegistrationError
from messaging.kinds import MessageRegistry


def shapes_report(db: Database, registry: MessageRegistry) -> dict[str, Any]:
    """The stored shapes with their counts and where each leads (``ok``: every one
    reaches a current class and the declarations hold together), the upcasters declared,
    and ``declaration``: why they do not hold together (a gap in a class's versions, an
    upcaster leading nowhere: what an instance would refuse to start with), or None."""
    try:
        registry.check_upcasters()
        declaration = None
    except RegistrationError as exc:
        declaration = str(exc)
    m = db.schema.messages
    query = (
        select(m.c.topic, m.c.type, m.c.payload_version, func.count())
        .where(m.c.tenant == db.tenant)
        .group_by(m.c.topic, m.c.type, m.c.payload_version)
        .order_by(m.c.topic, m.c.type, m.c.payload_version)
    )
    hint = f"FORCE INDEX ({db.schema.prefix}ix_messages_shape)"
    query = query.with_hint(m, hint, "mysql").with_hint(m, hint, "mariadb")
    with db.read() as conn:
        rows = conn.execute(query).all()
    versions = registry.versions()
    shapes = []
    for topic, type_name, version, count in rows:
        entry: dict[str, Any] = {
            "topic": topic,
            "type": type_name,
            "version": int(version),
            "count": int(count),
        }
        try:
            (name, current), steps = registry.upcasters.resolve((type_name, version), versions)
        except DecodeError as exc:
            entry.update(reaches=None, problem=exc.reason)
        else:
            entry.update(reaches=f"{name} v{current}", via=[step.label for step in steps])
        shapes.append(entry)
    return {
        "ok": declaration is None and all(entry["reaches"] for entry in shapes),
        "shapes": shapes,
        "upcasters": [step.label for step in registry.upcasters.steps()],
        "declaration": declaration,
    }


def format_shapes(report: dict[str, Any]) -> str:
    """The report as text: one line per stored shape, then the verdict."""
    lines = []
    for entry in report["shapes"]:
        where = f"{entry['topic']} {entry['type']} v{entry['version']}: {entry['count']}"
        if entry["reaches"] is None:
            lines.append(f"{where}  UNREADABLE: {entry['problem']}")
        elif entry["via"]:
            lines.append(f"{where}  -> {entry['reaches']} via {'; '.join(entry['via'])}")
        else:
            lines.append(f"{where}  current")
    unreadable = sum(1 for entry in report["shapes"] if entry["reaches"] is None)
    lines.append(
        f"{unreadable} stored shape(s) reach no current class"
        if unreadable
        else f"every stored shape ({len(report['shapes'])}) reaches a current class"
    )
    if report["declaration"] is not None:
        lines.append(f"the declarations do not hold together: {report['declaration']}")
    return "\n".join(lines)
