"""Events: the decision history of jobs and nodes (hcontrol show events); nodes added with
hcontrol node add (their SSH port, user and agent socket live in the store).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.Integer),
        sa.Column("node", sa.String(1000)),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_job", "events", ["job_id"])
    op.create_index("ix_events_time", "events", ["time"])
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("added", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("port", sa.Integer))
        batch.add_column(sa.Column("ssh_user", sa.String(64)))
        batch.add_column(sa.Column("agent_socket", sa.String(255)))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name in ("agent_socket", "ssh_user", "port", "added"):
            batch.drop_column(name)
    op.drop_index("ix_events_time", table_name="events")
    op.drop_index("ix_events_job", table_name="events")
    op.drop_table("events")
