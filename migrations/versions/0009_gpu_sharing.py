"""Fractional GPUs: a job's card-share request, the share each rank got, and per-card sharing
mode and topology.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpu_fraction", sa.Float))
        batch.add_column(sa.Column("gpu_mem_mb", sa.Integer))
        batch.add_column(sa.Column("gpu_compute", sa.Integer))
        batch.add_column(sa.Column("gpu_qos", sa.String(16)))
    with op.batch_alter_table("run_ranks") as batch:
        batch.add_column(sa.Column("gpu_mem_mb", sa.Integer))
        batch.add_column(sa.Column("gpu_compute", sa.Integer))
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("shareable", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("isolation", sa.String(8), nullable=False, server_default="none"))
        batch.add_column(sa.Column("links", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("links")
        batch.drop_column("isolation")
        batch.drop_column("shareable")
    with op.batch_alter_table("run_ranks") as batch:
        batch.drop_column("gpu_compute")
        batch.drop_column("gpu_mem_mb")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_qos")
        batch.drop_column("gpu_compute")
        batch.drop_column("gpu_mem_mb")
        batch.drop_column("gpu_fraction")
