"""The base layer every other layer imports: errors, parameters, objectives, measurements, models and
workloads. Nothing here imports a device, a pool or Ray."""
