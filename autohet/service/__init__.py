"""``autohet serve``: an exported config behind HTTP on Ray Serve.

``plan`` decides the replicas (one per executor of a data-parallel throughput config, one holding
the whole runner otherwise), ``routing`` shares requests between them by speed, ``requests`` turns
HTTP bodies into model inputs and outputs into answers (all three without Ray), ``app`` is the
Serve application and ``server`` starts, drains and stops it. Ray Serve is imported only by ``app``
and ``server``, once a service starts.
"""

from __future__ import annotations

from autohet.service.server import Service, ServiceOptions

__all__ = ["Service", "ServiceOptions"]
