"""Accounts: each job's account, and the limits and shares admins change live.

Revision ID: 0008
Revises: 0005
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("account", sa.String(64)))
    op.create_table(
        "limits",
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("shares", sa.Integer),
        sa.Column("max_gpus", sa.Integer),
        sa.Column("max_pending", sa.Integer),
        sa.Column("max_jobs", sa.Integer),
        sa.Column("updated_by", sa.String(64)),
        sa.Column("updated_at", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("limits")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("account")
