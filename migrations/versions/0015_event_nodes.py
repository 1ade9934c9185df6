"""The nodes each event names, one row per node: a node's history (`hcontrol show events
--node`) is read through an index instead of LIKE patterns over every event (eighth audit: at
2,000,000 events each lookup took 0.5 s on the store's one thread, and a user looping on a name
that matches nothing delayed everyone's requests and starts by seconds). Existing events are
copied in. And indexes for job listings (store/listing.py walks them in id order): of (user,
state, id), (name, state, id), (partition, state, id) and of end times. `squeue -u`, `-n`, `-p`
with any states and `hacct -S` had read or sorted every job that matched one filter (0.06-1 s
a request at 1,000,000-2,000,000 jobs; eighth and ninth audits).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    event_nodes = op.create_table(
        "event_nodes",
        sa.Column("event_id", sa.Integer, sa.ForeignKey("events.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("node", sa.String(64), primary_key=True),
    )
    op.create_index("ix_event_nodes_node", "event_nodes", ["node", "event_id"])
    op.create_index("ix_jobs_name", "jobs", ["name", "state", "id"])
    op.create_index("ix_jobs_partition", "jobs", ["partition", "state", "id"])
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])
    op.drop_index("ix_jobs_user_state", table_name="jobs")
    op.create_index("ix_jobs_user_state", "jobs", ["user", "state", "id", "spec_bytes"])
    c = op.get_bind()
    rows = c.execute(sa.text("SELECT id, node FROM events WHERE node IS NOT NULL AND node != ''"))
    while batch := rows.fetchmany(10_000):
        c.execute(event_nodes.insert(), [{"event_id": i, "node": n[:64]}
                                         for i, names in batch for n in sorted(set(names.split(","))) if n])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_state", table_name="jobs")
    op.create_index("ix_jobs_user_state", "jobs", ["user", "state", "spec_bytes"])
    op.drop_index("ix_jobs_end_time", table_name="jobs")
    op.drop_index("ix_jobs_partition", table_name="jobs")
    op.drop_index("ix_jobs_name", table_name="jobs")
    op.drop_index("ix_event_nodes_node", table_name="event_nodes")
    op.drop_table("event_nodes")
