#!/bin/sh
# Issue 34, replica_log_options::log_budget: memory per worker against the budget, from the
# deterministic simulated runs of tests/unit/replica_log_test.cpp (virtual time: the same
# figures on any machine). Run from the repository root; writes memory.txt and prints the table.
set -e
g++ -std=c++20 -O1 -DASIO_STANDALONE -DASIO_NO_DEPRECATED -DEIGEN_RUNTIME_NO_MALLOC \
    -DASIO_DISABLE_STD_ALIGNED_ALLOC -DASIO_RECYCLING_ALLOCATOR_CACHE_SIZE=32 \
    -Iinclude -Itests/support -I. -isystem /usr/include/eigen3 \
    tests/unit/replica_log_test.cpp tests/support/doctest_main.cpp -o /tmp/replica_log_test \
    -lz -lssl -lcrypto -pthread
/tmp/replica_log_test -tc='replica_log log_budget*' > docs/results/swift/log_budget/memory.txt 2>&1
python3 docs/results/swift/log_budget/table.py docs/results/swift/log_budget/memory.txt
