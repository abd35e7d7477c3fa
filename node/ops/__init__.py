"""Operations: metrics (hot-path counters, scrape-time gauges, the catalogue of every
metric) and the admin HTTP port with its access rule.
"""
