"""Nodes: since when a node has not been responding (it goes down after a configured time).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("unreachable_since", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("unreachable_since")
