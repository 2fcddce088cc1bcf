"""``autohet serve``: an exported config behind HTTP (and gRPC) on Ray Serve.

``plan`` decides the replicas (one per executor of a data-parallel throughput config, one holding
the whole runner otherwise), ``routing`` shares requests between them by speed, ``requests`` and
``oip`` turn bodies into model inputs and outputs into answers (all without Ray). ``listener``
(with ``connection`` and ``http_messages``) is each ingress's HTTP/1.1 server, ``oip_grpc`` its gRPC
one. ``app`` is the Serve application (``ingress``, ``replica``, a control deployment) and
``server`` starts, drains and stops it. Ray Serve is imported only by ``app``, ``replica`` and
``server``, once a service starts. Devices and the cluster are reached through
the runtime (``autohet.load``, ``runtime.hosting``), never ``executors/`` or ``pool/``.
"""

from __future__ import annotations

from autohet.service.server import Service, ServiceOptions

__all__ = ["Service", "ServiceOptions"]
