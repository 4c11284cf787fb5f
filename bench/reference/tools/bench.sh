#!/bin/bash
cd /work/main
B=/work/llamacpp/build/bin/llama-bench; M=models/SmolLM2-135M-Instruct.Q4_1.gguf
quiet=0
for i in $(seq 1 90); do
  busy=$(ps -eo pcpu=,pid= --sort=-pcpu | awk -v me=$$ '$1>20' | wc -l)
  if [ "$busy" -eq 0 ]; then quiet=1; break; fi; sleep 4; done
echo "quiet=$quiet waited=$((i*4))s load=$(cat /proc/loadavg)" > /tmp/ref/bench2.log
$B -m $M -t 2 -p 0 -n 128 -r 10 -o json 2>/dev/null > /tmp/ref/benchG2.json
$B -m $M -t 1 -p 0 -n 128 -r 10 -o json 2>/dev/null > /tmp/ref/benchG1.json
$B -m $M -t 2 -p 512 -n 0 -r 5 -o json 2>/dev/null > /tmp/ref/benchGpp.json
echo "after load=$(cat /proc/loadavg)" >> /tmp/ref/bench2.log
ps -eo pcpu=,comm= --sort=-pcpu | head -5 >> /tmp/ref/bench2.log
