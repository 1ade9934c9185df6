"""What the scheduler learned from the jobs that ended (the MLFQ's job-size model), kept across
restarts.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_state",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("through_end", sa.Float, nullable=False),
        sa.Column("through_id", sa.BigInteger, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_state")
