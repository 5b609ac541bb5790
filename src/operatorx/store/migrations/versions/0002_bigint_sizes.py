"""Sizes as 64-bit integers: `ox_rows.m`, `n`, `k`, `tokens` and `case_index` BIGINT on PostgreSQL.

A case may give any size up to 2^63 - 1 (spec/base.py); PostgreSQL's INTEGER holds 2^31 - 1, so a
run with m = 2^31 was refused there while SQLite stored it. SQLite's INTEGER is already 64-bit and
its tables are left as they are.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_COLUMNS = ("case_index", "m", "n", "k", "tokens")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in _COLUMNS:
        op.alter_column("ox_rows", name, type_=sa.BigInteger(), existing_type=sa.Integer(),
                        existing_nullable=name != "case_index")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in _COLUMNS:
        op.alter_column("ox_rows", name, type_=sa.Integer(), existing_type=sa.BigInteger(),
                        existing_nullable=name != "case_index")
