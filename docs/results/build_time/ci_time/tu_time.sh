#!/bin/bash
# usage: h2_tu_time.sh <build dir> <source substring>: compiles that TU again (output to /tmp) under /usr/bin/time
b=$1; pat=$2
cmd=$(python3 -c "
import json,sys
for e in json.load(open('$b/compile_commands.json')):
  if '$pat' in e['file']:
    c=e['command'].split(' -o ')[0]+' -o /tmp/h2_tu_'+'$(basename $b)'+'.o -c '+e['file']; print(c); break")
cd $b && /usr/bin/time -f "$(basename $b) $pat wall %e user %U sys %S maxrss_kb %M load $(cut -d' ' -f1 /proc/loadavg)" $cmd
