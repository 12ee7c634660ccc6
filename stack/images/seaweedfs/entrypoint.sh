#!/bin/sh
# Like upstream's image: a weed command runs `weed -logtostderr=true COMMAND ARGS`; anything else runs as is.
set -e
case "$1" in
  server|master|volume|filer|s3|mini|iam|webdav|mount|shell|version|scaffold|admin|worker)
    exec /usr/bin/weed -logtostderr=true "$@" ;;
  *)
    exec "$@" ;;
esac
