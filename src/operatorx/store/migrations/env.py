"""Alembic environment: OperatorX runs migrations in-process (store/migrate.py) on a connection it has
already opened and locked, passed in `config.attributes["connection"]`; there is no alembic.ini."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("OperatorX migrations run through `operatorx db upgrade`, not the alembic command")

context.configure(connection=connection, target_metadata=None, render_as_batch=True,
                  version_table=context.config.attributes.get("version_table", "alembic_version"),
                  transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
