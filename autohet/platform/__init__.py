"""This machine beside the model: its fingerprint, Ray's start-up, host copies on several threads, the
garbage collector kept out of a run, and the sensors (energy, power, temperature, clocks) with the meter
and the thermal rules that read them. Base layer: it imports only ``autohet.core``."""
