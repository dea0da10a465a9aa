"""A Prometheus (or Mimir, Thanos) server as the source: the same SignalSets as a direct scan, one per instance, from
PromQL generated out of the probe specs (``probes/*.toml``), never hand-written per rule.

What is asked, for all instances at once (so the number of queries does not grow with the fleet):

    which instances, which server   /api/v1/series for the specs' wire names under the selector, over the window
    counters                        increase(NAME{SEL}[W])                     (rate = increase / W)
    histograms                      histogram_quantile(q, sum by (instance labels, le) (rate(NAME_bucket{SEL}[W])))
                                    for q = 0.5, 0.9, 0.95, 0.99, with the bucket and _sum increases, in one query
    gauges                          a range query of last_over_time(NAME{SEL}[S]) every S over the window (S = the
                                    scrape interval, or avg_over_time over a longer S when the window is long): the
                                    samples for the charts, and last/mean/min/max from them
    info                            last_over_time(NAME{SEL}[W])
    GPU (dcgm-exporter)             the dcgm probe's signals, joined to each server by pod, else by host

Counters and gauges keep every label, so the specs' ``match``, ``fold_labels``, ``per_gpu`` and per-engine
breakdowns work exactly as they do on a scraped page (``llmdiag.collect.signals.SignalBuilder`` builds the signals
from the query results). ``W`` is the requested span (``--at`` with the default window, ``--since``, ``--from/--to``)
and at least 4 scrape intervals; the scrape interval is discovered from /api/v1/targets (or from sample spacing).

A timeline (``collect_prometheus_timeline``) runs the same queries as range queries with ``W`` = the step: the query
count depends neither on the fleet size nor on the number of steps.

Every signal's ``source`` is ``prometheus: <the PromQL>`` and its ``verify`` a curl of that query (credentials as
shell variables, never their values). A query that fails leaves its signals unavailable with the server's words;
an instance with no data has every signal unavailable, so its verdict is ``unknown``, never healthy.
"""
