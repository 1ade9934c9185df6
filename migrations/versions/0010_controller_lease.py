"""Controller lease: which controller is active, under which epoch (fencing), until when.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "controller_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(300), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("controller_lease")
