"""Runs: GPU telemetry rollups (mean and max GPU utilization, peak GPU memory, energy, mean CPU).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COLUMNS = (("gpu_util_mean", sa.Float), ("gpu_util_max", sa.Float), ("gpu_mem_max_mb", sa.Integer),
           ("energy_j", sa.Float), ("cpu_mean", sa.Float), ("telemetry_samples", sa.Integer))


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, typ in COLUMNS:
            batch.add_column(sa.Column(name, typ))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, _typ in reversed(COLUMNS):
            batch.drop_column(name)
