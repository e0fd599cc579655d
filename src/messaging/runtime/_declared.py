"""The consumers an instance's code declares, and how they are configured.

Filled at the instance's start: each transactional consumer's distribution and tenant
fingerprint (what the database compares declarations by); a consumer whose declaration
the database finds stale is forgotten (:meth:`Declared.forget`), and this instance then
applies nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from messaging._consumers import ConsumerSpec
from messaging._messages import MessageRegistry
from messaging._settings import ConsumerGroupSettings, ConsumerSettings, Distribution, Settings
from messaging.distribution._needs import published
from messaging.store._database import Database
from messaging.versions._declarations import tenant_fingerprint


class Declared:
    """What one instance's code declares: its consumers, their settings, the messages it
    reads, and (from its start on) each transactional consumer's distribution and
    fingerprint."""

    def __init__(
        self, specs: Sequence[ConsumerSpec], settings: Settings, registry: MessageRegistry
    ) -> None:
        self.specs = list(specs)
        self.settings = settings
        self.registry = registry
        self.fingerprints: dict[str, str] = {}
        """Each transactional consumer's declaration, as the tenant's database knows it."""
        self.distributions: dict[str, Distribution] = {}

    @property
    def consumer_settings(self) -> ConsumerSettings:
        """The instance-wide ``consumer`` settings (each consumer may override some)."""
        return self.settings.messaging.consumer

    def group(self, spec: ConsumerSpec) -> ConsumerGroupSettings:
        """The settings of ``spec``'s kind (``projections:``, ``routes:``, ``sagas:``)."""
        return self.settings.group(spec.kind.settings_group)

    def settings_of(self, spec: ConsumerSpec) -> ConsumerSettings:
        """``spec``'s own consumer settings (its overrides over the instance's)."""
        return self.group(spec).consumer_settings_for(spec.name, self.consumer_settings)

    def distribution(self, spec: ConsumerSpec) -> Distribution:
        """The configured distribution of a consumer."""
        return self.group(spec).distribution_for(spec.name)

    def fingerprint(self, db: Database) -> dict[str, dict[str, Any]]:
        """Take each transactional consumer's distribution and tenant fingerprint; return
        what this instance runs, as its row publishes it to its peers."""
        runs = {}
        for spec in self.specs:
            if spec.transactional:
                self.distributions[spec.name] = self.distribution(spec)
                self.fingerprints[spec.name] = tenant_fingerprint(db, spec, self.registry)
                runs[spec.name] = self.run_of(spec.name, spec)
        return runs

    def forget(self, name: str) -> None:
        """The database holds another declaration of ``name``: apply nothing of it."""
        del self.fingerprints[name]

    def running(self) -> dict[str, ConsumerSpec]:
        """The transactional consumers this instance declared and did not find stale."""
        return {s.name: s for s in self.specs if s.transactional and s.name in self.fingerprints}

    def run_of(self, name: str, spec: ConsumerSpec) -> dict[str, Any]:
        """How this instance runs ``spec`` (consumer ``name``, or a version of it being
        built), as its row publishes it: distribution, fingerprint, what it can read."""
        return {
            "distribution": self.distributions[name].value,
            "fingerprint": self.fingerprints[name],
            **published(self.registry, spec),  # what it can read (messaging.distribution._needs)
        }
