# Shared by scripts that start a broker (sourced): pick its ports before it starts, then
# wait the way a user does, for the first moment the ports answer (not for a log line).
#
#   start_daemon LOG PIDVAR TCPVAR HTTPVAR -- command args...
# runs `command args... --tcp-address=127.0.0.1:P --http-address=127.0.0.1:Q` in the
# background (stdout and stderr appended to LOG), sets PIDVAR to its pid and TCPVAR and
# HTTPVAR to the two addresses, and returns once both accept a TCP connection (60 s at
# most; 1 if the process exits first or time runs out). A port taken by someone else
# between the pick and the bind ("address already in use") is retried on fresh ports,
# up to 3 times.

# free_port: a loopback port the kernel just handed out (bound, then released).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# port_answers HOST:PORT: true once something accepts a connection there.
port_answers() {
  local hp="$1"
  (exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}") 2>/dev/null
}

start_daemon() {
  local log="$1" pidvar="$2" tcpvar="$3" httpvar="$4"
  shift 5
  local attempt tcp http pid deadline
  for attempt in 1 2 3; do
    tcp="127.0.0.1:$(free_port)"
    http="127.0.0.1:$(free_port)"
    local mark
    mark=$(wc -l <"$log" 2>/dev/null || echo 0)
    "$@" --tcp-address="$tcp" --http-address="$http" >>"$log" 2>&1 &
    pid=$!
    printf -v "$pidvar" '%s' "$pid"
    printf -v "$tcpvar" '%s' "$tcp"
    printf -v "$httpvar" '%s' "$http"
    deadline=$(( $(date +%s) + 60 ))
    while [[ $(date +%s) -le $deadline ]]; do
      if port_answers "$tcp" && port_answers "$http"; then
        return 0
      fi
      if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        echo "$1 exited early with status $?" >&2
        printf -v "$pidvar" '%s' ""
        if tail -n +"$((mark + 1))" "$log" | grep -qi "address already in use"; then
          continue 2
        fi
        return 1
      fi
      sleep 0.02
    done
    echo "$1: ports $tcp and $http did not answer within 60 s" >&2
    return 1
  done
  return 1
}
