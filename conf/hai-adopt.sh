# hai-cluster (scripts/install-node --adopt; /etc/profile.d/hai-adopt.sh): an ssh session that
# was adopted into a job gets the job's variables (HAI_JOB_ID, CUDA_VISIBLE_DEVICES, ...). The
# agent writes them to ENV_DIR/<job>.<attempt>.sh when it adopts the session; the session's
# cgroup (the job's run cgroup, named <job>.<attempt>) says which file is this session's.
_hai_run=$(sed -n 's,^0::.*/,,p' /proc/self/cgroup 2>/dev/null)
case $_hai_run in
    '' | *[!0-9.]* | .* | *. | *.*.*) ;;
    *.*) [ -r "ENV_DIR/$_hai_run.sh" ] && . "ENV_DIR/$_hai_run.sh" ;;
esac
unset _hai_run
