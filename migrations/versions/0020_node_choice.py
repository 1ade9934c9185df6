"""--exclusive, -w/--nodelist and -x/--exclude, as columns the scheduler's snapshot reads.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not a batch: a batch rebuilds jobs on SQLite, and dropping the old table
# (foreign keys on) deletes through ON DELETE CASCADE every run and array spec that names a job.
def upgrade() -> None:
    op.add_column("jobs", sa.Column("exclusive", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("required_nodes", sa.String(1000)))
    op.add_column("jobs", sa.Column("excluded_nodes", sa.String(1000)))


def downgrade() -> None:
    for name in ("excluded_nodes", "required_nodes", "exclusive"):
        op.drop_column("jobs", name)  # SQLite 3.35+ (Debian 12 has 3.40)
