"""-O/--overcommit as a jobs column the snapshot reads, and reservations' Flags=.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


# Plain ALTER TABLE (a nullable column, or one with a server default), not a batch rebuild (see 0020).
def upgrade() -> None:
    op.add_column("jobs", sa.Column("overcommit", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("reservations", sa.Column("flags", sa.JSON))


def downgrade() -> None:
    op.drop_column("reservations", "flags")
    op.drop_column("jobs", "overcommit")  # SQLite 3.35+ (a batch rebuild of jobs cascades: see 0020)
