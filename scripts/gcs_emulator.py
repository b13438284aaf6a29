r"""A local Cloud Storage server for dry runs of gs:// workdirs and checkpoints.

  pip install -e '.[test]'   # brings gcp-storage-emulator (pinned)
  python scripts/gcs_emulator.py start --port 9023 --in-memory &
  export TENSORSTORE_GCS_HTTP_URL=http://localhost:9023 \
         STORAGE_EMULATOR_HOST=http://localhost:9023 \
         GOOGLE_AUTH_TOKEN_FOR_TESTING=test
  # then any script with --workdir=gs://BUCKET/... (create the bucket first:
  # see docs/storage.md)

It is gcp-storage-emulator (same command-line flags) with four behaviours
of Cloud Storage that the stock emulator lacks and our I/O relies on:

1. the `x-goog-generation` header on downloads: tensorstore's OCDBT reader
   (orbax checkpoints) refuses a download without it ("Malformed
   StorageGeneration"; the stock emulator then looks like a damaged
   checkpoint);
2. `ifGenerationMatch` preconditions on uploads and deletes (HTTP 412 when
   they fail), which the workdir lock's lease relies on;
3. a listing's `startOffset`/`endOffset`, with which tensorstore lists a
   directory;
4. empty uploads (an empty `config.gin`), on which it drops the connection.

The tests run the same server (tests/gcs_emulator.py).
"""

import http
import json
import sys

from gcp_storage_emulator import exceptions
from gcp_storage_emulator.handlers import objects


def _generation(storage, bucket_name: str, object_id: str) -> str | None:
  try:
    return storage.get_file_obj(bucket_name, object_id)["generation"]
  except exceptions.NotFound:
    return None


_download = objects.download
_insert = objects.insert


def download(request, response, storage, *args, **kwargs):
  generation = _generation(storage, request.params["bucket_name"],
                           request.params["object_id"])
  if generation is not None:
    response["x-goog-generation"] = generation
  return _download(request, response, storage, *args, **kwargs)


def insert(request, response, storage, *args, **kwargs):
  match = request.query.get("ifGenerationMatch")
  if match and "name" in request.query:
    current = _generation(storage, request.params["bucket_name"],
                          request.query["name"][0])
    if (current or "0") != match[0]:
      response.status = http.HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412,
                               "message": "Precondition Failed"}})
      return None
  if request.query.get("uploadType") == ["media"] and request.data is None:
    request._data = b""  # pylint: disable=protected-access  (empty object)
  return _insert(request, response, storage, *args, **kwargs)


_ls = objects.ls


def ls(request, response, storage, *args, **kwargs):
  result = _ls(request, response, storage, *args, **kwargs)
  start = (request.query.get("startOffset") or [""])[0]
  end = (request.query.get("endOffset") or [None])[0]
  if (start or end) and response.status == http.HTTPStatus.OK:
    listing = json.loads(response._content)  # pylint: disable=protected-access
    listing["items"] = [o for o in listing.get("items", [])
                        if o["name"] >= start and (end is None
                                                   or o["name"] < end)]
    response.json(listing)
  return result


_delete = objects.delete


def delete(request, response, storage, *args, **kwargs):
  """A delete honours `ifGenerationMatch` too (the lock's release)."""
  match = request.query.get("ifGenerationMatch")
  if match:
    current = _generation(storage, request.params["bucket_name"],
                          request.params["object_id"])
    if (current or "0") != match[0]:
      response.status = http.HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412,
                               "message": "Precondition Failed"}})
      return None
  return _delete(request, response, storage, *args, **kwargs)


objects.download = download
objects.insert = insert
objects.delete = delete
objects.ls = ls

if __name__ == "__main__":
  # Imported after the handlers are replaced: its route table reads them.
  from gcp_storage_emulator import __main__ as emulator  # pylint: disable=g-import-not-at-top
  sys.exit(emulator.main(sys.argv[1:]))
