#!/usr/bin/env bash
# The 442-token /embed_all A/B again, with the servers' ports and the order of the rounds swapped against
# the first run of bench/results/token-graphs-2026-12-07/sparse_ab.sh: this tree started first, on 18400, the
# tree before token-row graphs (BASE, a `git archive` tar of 94fd652) on 18401, measured new, base, base, new,
# new, base on one 400-word text (442 tokens), /embed_sparse and /embed_all, 80 requests of which the first
# 20 untimed. Run from the repository root:
#   git archive 94fd652 -o /tmp/base.tar && BASE=/tmp/base.tar bash bench/results/h200-2026-12-07/embed_all_ab.sh
FIRST=new ORDER="new base base new new base" \
CLIENT_ARGS="--words 400 --routes /embed_sparse,/embed_all --requests 80 --untimed 20" \
  exec bash bench/results/token-graphs-2026-12-07/sparse_ab.sh
