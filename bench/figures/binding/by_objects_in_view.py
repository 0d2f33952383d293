"""Current-scene accuracy per question kind and objects in view (1, or 2 and more), recomputed from
`infmllm-eval --json` output: its mistakes against the world's questions for the same seeds.
With two or more objects in view the model has to pick the one asked about; "others" counts the
wrong answers there that name another object in view (its colour or shape), and "apart" the
lookups there whose asked object shares none of the 16 patches with another object (the vision
stage's rule, vision_pretraining.patches_held): if shared patches were the cause, these would be
right.

usage: python by_objects_in_view.py EVAL.json [EVAL.json ...]"""
import json
import sys
from collections import Counter

from infmllm_ros.evaluation import frame_times
from infmllm_ros.synthetic.render import COLOURS, SHAPES
from infmllm_ros.synthetic.questions import generate_questions
from infmllm_ros.synthetic.world import generate_episode
from infmllm_ros.tiny_model.evidence import asked_object
from infmllm_ros.tiny_model.vision_pretraining import patches_held


def patches(state) -> set[int]:
    return {cell for cell, _ in patches_held(state.x, state.y, state.radius)}


for path in sys.argv[1:]:
    result = json.load(open(path))
    duration, first = result["duration_s"], result.get("first_seed")
    if first is None:   # older JSON: the seed ranges used here start at 1, 500, 2000, 3000 or 7000
        first = max(s for s in (1, 500, 2000, 3000, 7000) if s <= min(m["seed"] for m in result["mistakes"]))
    wrong = {(m["seed"], round(m["t"], 2)): m["answer"] for m in result["mistakes"]}
    right, total, others, apart = Counter(), Counter(), 0, Counter()
    for seed in range(first, first + result["episodes"]):
        episode = generate_episode(seed, duration)
        for question in generate_questions(episode, seed):
            if question.kind not in ("colour_of_shape", "shape_of_colour"):
                continue
            shown = [t for t in frame_times(duration) if t <= question.t][-1]
            in_view = episode.visible(shown)
            key = (question.kind, "2+" if len(in_view) > 1 else "1")
            answer = wrong.get((seed, round(question.t, 2)))
            total[key] += 1
            right[key] += answer is None
            others += len(in_view) > 1 and answer in {o.colour for o in in_view} | {o.shape for o in in_view}
            colour, shape = asked_object(question.text, question.answer)
            asked = [o for o in in_view if (o.colour, o.shape) == (list(COLOURS)[colour], SHAPES[shape])]
            if len(in_view) > 1 and len(asked) == 1 and not any(patches(asked[0]) & patches(o)
                                                                 for o in in_view if o is not asked[0]):
                apart["total"] += 1
                apart["right"] += answer is None
    print(f"{path.split('/')[-1]:34s}", "  ".join(f"{kind} ({n} in view) {right[kind, n]}/{total[kind, n]}"
                                               for kind, n in sorted(total)),
          f"  others {others}/{sum(total[k] - right[k] for k in total if k[1] == '2+')}",
          f"  2+ apart {apart['right']}/{apart['total']}")
