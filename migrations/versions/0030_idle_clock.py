"""Idle reclamation: a run's idle clock (its idle stretch's first sample, its warning), kept
across controller restarts.

Revision ID: 0030
Revises: 0028
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0028"
branch_labels = None
depends_on = None


# Plain ALTER TABLE (nullable columns), not a batch rebuild (see 0020).
def upgrade() -> None:
    op.add_column("runs", sa.Column("idle_since", sa.Float))
    op.add_column("runs", sa.Column("idle_warned", sa.Float))


def downgrade() -> None:
    op.drop_column("runs", "idle_warned")
    op.drop_column("runs", "idle_since")
