#!/usr/bin/env bash
# A remote worker in bash, with curl and jq only: leases `double` jobs and
# completes each with twice its argument, until N jobs are done.
#   remote_worker.sh URL WORKER_ID TOKEN N
set -euo pipefail
url=$1 worker=$2 token=$3 want=$4
auth="Authorization: Bearer $token"
json="Content-Type: application/json"
done_count=0
while [ "$done_count" -lt "$want" ]; do
  lease=$(curl -sf -X POST "$url/v1/leases" -H "$auth" -H "$json" \
    -d "$(jq -n --arg w "$worker" '{worker: $w, tasks: ["double"], limit: 5, wait_s: 2}')")
  while read -r job; do
    [ -n "$job" ] || continue
    id=$(jq -r '.id' <<<"$job")
    lease_token=$(jq -r '.token' <<<"$job")
    n=$(jq -r '.args[0]' <<<"$job")
    curl -sf -X POST "$url/v1/leases/$id/complete" -H "$auth" -H "$json" \
      -d "$(jq -n --arg w "$worker" --arg t "$lease_token" --argjson r "$((n * 2))" \
            '{worker: $w, token: $t, result: $r}')" > /dev/null
    echo "done $id"
    done_count=$((done_count + 1))
  done < <(jq -c '.jobs[]' <<<"$lease")
done
