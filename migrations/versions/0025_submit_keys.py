"""Idempotency keys of submissions: a retry after a lost reply returns the job it created.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "submit_keys",
        sa.Column("uid", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.Integer, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_index("ix_submit_keys_created", "submit_keys", ["created"])


def downgrade() -> None:
    op.drop_index("ix_submit_keys_created", table_name="submit_keys")
    op.drop_table("submit_keys")
