"""Advance reservations (scontrol create reservation) and the job's --reservation.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("nodes", sa.JSON, nullable=False),
        sa.Column("start_time", sa.Float, nullable=False),
        sa.Column("end_time", sa.Float, nullable=False),
        sa.Column("users", sa.JSON, nullable=False),
        sa.Column("accounts", sa.JSON, nullable=False),
        sa.Column("created_by", sa.String(64)),
        sa.Column("created_at", sa.Float),
    )
    # Plain ALTER TABLE, not a batch (see 0020: a batch rebuild of jobs cascades on SQLite).
    op.add_column("jobs", sa.Column("reservation", sa.String(64)))


def downgrade() -> None:
    op.drop_column("jobs", "reservation")
    op.drop_table("reservations")
