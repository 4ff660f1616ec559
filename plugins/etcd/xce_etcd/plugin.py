"""The etcd backend's plugin: the ``[etcd]`` section and the controller's election and store
for ``[controller] backend = "etcd"`` (it answers nothing for other backends).

Importing this registers hooks only; httpx and the backend's modules are imported when a
controller candidate asks for its election.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xce_etcd.settings import SECTION
from xcecore.hookspecs import hookimpl
from xcecore.records import ConfigSection

if TYPE_CHECKING:
    from xce_etcd.election import EtcdElection
    from xce_etcd.store import EtcdStore
    from xcecore.config import Config

BACKEND = "etcd"


@hookimpl
def xce_config_sections() -> Iterable[ConfigSection]:
    """The ``[etcd]`` section."""
    return [SECTION]


@hookimpl
def xce_controller_election(advertise: str, backend: str, config: Config | None) -> EtcdElection | None:
    """An :class:`~xce_etcd.election.EtcdElection` with its own client, for backend "etcd"."""
    if backend != BACKEND:
        return None
    from xce_etcd.client import EtcdClient
    from xce_etcd.election import EtcdElection
    from xce_etcd.settings import settings_from

    if config is None:
        raise RuntimeError("the etcd backend needs the configuration ([etcd] endpoints)")
    settings = settings_from(config.section("etcd"))
    client = EtcdClient(list(settings.endpoints), timeout=settings.request_timeout,
                        ca_file=settings.ca_file, cert_file=settings.cert_file,
                        key_file=settings.key_file, transport=settings.transport)
    return EtcdElection(client, settings, advertise)


@hookimpl
def xce_controller_store(backend: str, election: Any) -> EtcdStore | None:
    """An :class:`~xce_etcd.store.EtcdStore` guarded by ``election``, for backend "etcd"."""
    if backend != BACKEND:
        return None
    from xce_etcd.election import EtcdElection
    from xce_etcd.store import EtcdStore

    if not isinstance(election, EtcdElection):
        raise RuntimeError("backend \"etcd\": the store needs the etcd election (another plugin "
                           f"provided {type(election).__name__})")
    return EtcdStore(election.client, election.settings, election)
