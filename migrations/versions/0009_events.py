"""Events: the decision history of jobs and nodes (hcontrol show events).

Revision ID: 0009
Revises: 0005
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0005"
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


def downgrade() -> None:
    op.drop_index("ix_events_time", table_name="events")
    op.drop_index("ix_events_job", table_name="events")
    op.drop_table("events")
