#!/usr/bin/env bash
# Every link of the docs in the Debian package leads somewhere: each
# relative link of each Markdown file under /usr/share/doc/redis-lease/ of
# the built .deb names a file or directory of the package, and a link with
# an #anchor names a heading (or an <a id>/<a name>) of its Markdown page.
# Links to the web (http:, https:, mailto:) are not followed.
#
#   bash tests/deb/links.sh target/package/redis-lease_0.5.0_amd64.deb
#   bash tests/deb/links.sh DIR    # the Markdown files under DIR instead
#                                  # (a checkout: bash tests/deb/links.sh .)
#
# Needs only bash, dpkg-deb and awk: it runs where the package is built
# (make deb-test runs it) and on a fresh Debian that has the .deb.
set -euo pipefail

arg=${1:?usage: links.sh path/to/redis-lease_VERSION_ARCH.deb | DIR}
if [ -d "$arg" ]; then
  root=$(realpath "$arg")
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  dpkg-deb -x "$arg" "$work"
  root=$work/usr/share/doc/redis-lease
  [ -d "$root" ] || { echo "links: FAILED: $arg has no /usr/share/doc/redis-lease" >&2; exit 1; }
fi

# The anchors of a Markdown page, one a line: GitHub's slugs of its
# headings (lower case, punctuation but - and _ dropped, spaces to -, a
# repeated slug numbered -1, -2, ...), and the ids of <a id=...>/<a name=...>.
anchors() {
  awk '
    /^[[:space:]]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+[[:space:]]/ {
      h = $0
      sub(/^#+[[:space:]]+/, "", h); sub(/[[:space:]]+#*[[:space:]]*$/, "", h)
      h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h)
      gsub(/ /, "-", h)
      n = seen[h]++
      print (n ? h "-" n : h)
    }
    {
      line = $0
      while (match(line, /<a (id|name)="[^"]+"/)) {
        a = substr(line, RSTART, RLENGTH); sub(/^<a (id|name)="/, "", a); sub(/"$/, "", a)
        print a
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

# The link targets of a Markdown page, outside code blocks and code spans:
# the (...) of [text](target), and reference definitions [label]: target.
targets() {
  awk '
    /^[[:space:]]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)
      if (match(line, /^[[:space:]]*\[[^]]+\]:[[:space:]]+[^[:space:]]+/)) {
        t = substr(line, RSTART, RLENGTH); sub(/^[^]]*\]:[[:space:]]+/, "", t); print t
      }
      while (match(line, /\]\([^)[:space:]]+/)) {
        t = substr(line, RSTART + 2, RLENGTH - 2)
        print t
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

checked=0
broken=0
while IFS= read -r -d '' page; do
  dir=$(dirname "$page")
  while IFS= read -r target; do
    case $target in http:* | https:* | mailto:*) continue ;; esac
    checked=$((checked + 1))
    path=${target%%#*}
    anchor=
    [ "$path" = "$target" ] || anchor=${target#*#}
    if [ -z "$path" ]; then file=$page; else file=$dir/$path; fi
    rel=${page#"$root"/}
    if [ ! -e "$file" ]; then
      echo "links: $rel: $target: no such file"
      broken=$((broken + 1))
    elif [ -n "$anchor" ]; then
      if [ -d "$file" ] || [ "${file%.md}" = "$file" ]; then
        echo "links: $rel: $target: an anchor into a file that is not a Markdown page"
        broken=$((broken + 1))
      elif ! anchors "$file" | grep -qxF -- "$anchor"; then
        echo "links: $rel: $target: no heading or <a id> '$anchor' in ${file#"$root"/}"
        broken=$((broken + 1))
      fi
    fi
  done < <(targets "$page")
done < <(find "$root" -name '*.md' -type f ! -path '*/node_modules/*' ! -path '*/target/*' ! -path '*/.tools/*' -print0 | sort -z)

pages=$(find "$root" -name '*.md' -type f ! -path '*/node_modules/*' ! -path '*/target/*' ! -path '*/.tools/*' | wc -l)
[ "$checked" -gt 0 ] || { echo "links: FAILED: no link found in $pages pages under $root" >&2; exit 1; }
if [ "$broken" -gt 0 ]; then
  echo "links: FAILED: $broken of $checked links in $pages pages lead nowhere" >&2
  exit 1
fi
echo "links: PASSED: $checked links in $pages pages, each to a file of the package (and its heading)"
