"""Job steps are kept: one row per srun of a run (its id, command, nodes, tasks, times and end),
for hacct's `12.0` rows, `hqueue -s`, and steps whose ids and routing outlive a controller
restart.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_steps",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step_id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("nodelist", sa.String(1000), nullable=False),
        sa.Column("counts", sa.String(1000), nullable=False),
        sa.Column("ntasks", sa.Integer, nullable=False),
        sa.Column("cpus", sa.Integer, nullable=False),
        sa.Column("origin", sa.String(64), nullable=False),
        sa.Column("start_time", sa.Float, nullable=False),
        sa.Column("end_time", sa.Float),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_signal", sa.Integer),
    )
    op.create_index("ix_run_steps_open", "run_steps", ["run_id"], sqlite_where=sa.text("end_time IS NULL"),
                    postgresql_where=sa.text("end_time IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_run_steps_open", table_name="run_steps")
    op.drop_table("run_steps")
