"""The training data of an EAGLE-3 head: text the target writes itself, and its hidden states over that text.

No download: the prompts are written here (templates over word lists, seeded), in the kinds of the builtin set
(conversation, translation, summarization, qa, math, rag) plus raw text openings for plain continuation; the
passages that summarization and rag prompts quote are written by the target first. None of the builtin prompts is
used, so acceptance on them is measured on text the head never saw.

For every text the target's forward (transformers', no cache) gives, per position: the inputs of the three aux
layers side by side (fc's input, float16), the final normed hidden state (the target's logits over the draft
vocabulary are that times lm_head's rows: computed in training, not stored) and the argmax of the full logits.
"""

from __future__ import annotations

import random
import time

import torch

TOPICS = ["a lighthouse keeper", "a new city park", "a school science fair", "a lost dog found after a week",
          "a village bakery", "a mountain railway", "a community garden", "a storm on the coast", "a local election",
          "a new bridge over the river", "a chess tournament", "a museum exhibition about ancient Egypt",
          "a recycling programme", "a bicycle repair shop", "a summer music festival", "a hospital volunteer",
          "a fishing boat rescue", "a library book sale", "a robot built by students", "an old windmill restored",
          "a marathon in the rain", "a farmers market", "a power cut in the city", "a new bus timetable",
          "a beekeeper", "a snow day at school", "a family restaurant", "a theatre play", "a space telescope",
          "a football final", "a solar farm", "a train delay", "a cooking class", "a bird watching club"]
ACTIVITIES = ["learning to cook", "saving money", "learning a language", "sleeping better", "starting to swim",
              "keeping a journal", "growing tomatoes", "taking better photos", "reading more books", "studying for exams",
              "moving to a new city", "learning the guitar", "working from home", "training a puppy", "hiking safely",
              "drinking more water", "organising a small office", "making new friends", "planning a road trip",
              "painting with watercolours"]
PEOPLE = ["my landlord", "my manager", "a friend", "my sister", "my teacher", "a new colleague", "the school",
          "my neighbour", "a customer", "my grandfather"]
THINGS = ["a broken heater", "a birthday party", "a late delivery", "a team lunch", "borrowing a ladder",
          "a noisy party next door", "a change of plans", "a thank-you for their help", "a job reference",
          "a meeting next Friday"]
FORMS = ["poem", "short story", "limerick", "haiku", "song verse", "diary entry", "fable"]
THEMES = ["the sea", "autumn leaves", "a city at night", "a rainy morning", "an old clock", "a sleepy owl",
          "the first snow", "a busy kitchen", "a quiet forest", "a paper boat", "the moon", "a summer garden"]
WHY = ["leaves change colour in autumn", "we have seasons", "the moon changes shape", "ice floats on water",
       "we need sleep", "birds fly south in winter", "the sea is salty", "thunder follows lightning",
       "bread rises", "magnets stick to the fridge", "we see rainbows", "cats purr", "the sun sets in the west"]
QUESTIONS = ["What is the capital city of Canada?", "Who painted the Mona Lisa?", "How many legs does a spider have?",
             "What is the largest ocean on Earth?", "Who discovered penicillin?", "What is the chemical symbol for gold?",
             "How many continents are there?", "What is the freezing point of water in Fahrenheit?",
             "Which animal is known as the ship of the desert?", "What language is spoken in Brazil?",
             "Who wrote Romeo and Juliet?", "What is the tallest mountain in the world?",
             "How many days are there in a leap year?", "What is the smallest planet in our solar system?",
             "What organ pumps blood through the body?", "What is the hardest natural substance?",
             "Which country is home to the kangaroo?", "What is the longest river in Africa?",
             "Who invented the telephone?", "What do bees make?", "What is the main ingredient in guacamole?",
             "How many minutes are there in a day?", "What is the capital of Japan?", "Who was the first president "
             "of the United States?", "What is photosynthesis?", "What is the speed of light?",
             "Which metal is liquid at room temperature?", "What is the largest mammal?",
             "In which country are the pyramids of Giza?", "What does DNA stand for?", "What causes tides?",
             "How many strings does a violin have?", "What is the currency of the United Kingdom?",
             "Which planet is known as the red planet?", "What is the square root of 81?",
             "Who developed the theory of relativity?", "What is the capital of Italy?", "What is a volcano?",
             "Why do we have leap years?", "What is the difference between weather and climate?"]
ENGLISH = ["The weather will be sunny tomorrow afternoon.", "My brother works at the hospital near the station.",
           "We are going to the cinema on Saturday evening.", "Where can I buy a ticket for the bus?",
           "The children played in the garden all morning.", "I would like a cup of coffee with milk, please.",
           "The shop closes early on Sundays.", "She has been learning to play the piano for two years.",
           "Our train leaves at half past seven.", "The library has many books about history.",
           "Please close the window before you leave.", "It is raining, so take an umbrella.",
           "My favourite season is spring because the flowers bloom.", "The restaurant on the corner serves fresh fish.",
           "He forgot his keys at the office yesterday.", "Can you help me carry these boxes upstairs?"]
FOREIGN = [("French", "Je voudrais réserver une table pour deux personnes ce soir."),
           ("French", "Il fait très froid ce matin et la route est glissante."),
           ("French", "Nous avons visité un petit village au bord de la mer."),
           ("German", "Ich lerne seit drei Jahren Spanisch in der Abendschule."),
           ("German", "Das Wetter ist heute schön, also gehen wir in den Park."),
           ("German", "Mein Bruder hat ein neues Fahrrad zum Geburtstag bekommen."),
           ("Spanish", "Mañana vamos a visitar a mis abuelos en el campo."),
           ("Spanish", "El restaurante abre a las ocho de la noche."),
           ("Spanish", "Me gusta leer novelas antes de dormir."),
           ("Italian", "Il treno per Roma parte alle nove e mezza."),
           ("Italian", "La mia amica cucina una pasta buonissima."),
           ("Portuguese", "O mercado fica perto da praça principal.")]
OPENINGS = ["The history of the printing press begins", "In the small town where I grew up,", "Scientists studying "
            "the ocean floor have found", "The best way to learn a new skill is", "When the first railways were "
            "built,", "Photosynthesis is the process by which", "Once upon a time, in a kingdom by the sea,",
            "The internet changed the way people", "Climate change affects farmers because", "A good breakfast "
            "should include", "The Roman Empire was", "Electric cars work by", "Mathematics is useful in everyday "
            "life because", "The human brain is", "In 1969, astronauts", "Volcanoes form when", "The city of Paris "
            "is famous for", "Learning to program a computer", "The story of the telephone starts", "Water is "
            "essential for life because", "My grandmother always said that", "The first step in baking bread is",
            "Jupiter is the largest planet", "Good teachers know that", "Trees help the environment by"]
RAG_QUESTIONS = ["What is the main event described in the passage?", "Who is mentioned in the passage?",
                 "When does the event in the passage take place?", "Where does the story in the passage happen?",
                 "What happened at the end, according to the passage?", "Why was this event important, according "
                 "to the passage?"]
MATH = ["A farmer has {a} rows of apple trees with {b} trees in each row. How many trees does he have? Show your work.",
        "A box holds {a} pencils. How many pencils are in {b} boxes? Explain your answer.",
        "Lisa had {c} dollars. She spent {a} dollars on a book. How much money does she have left? Show the steps.",
        "A car travels {a} kilometres per hour for {b} hours. How far does it go? Explain your answer.",
        "A class of {c} students is split into groups of {b}. How many groups are there, and how many students "
        "are left over? Show your work.",
        "A jacket costs {c} dollars and is on sale for {p} percent off. What is the sale price? Show the calculation.",
        "A garden is {a} metres long and {b} metres wide. What are its area and perimeter? Explain each step.",
        "Sam reads {a} pages a day. His book has {c} pages. How many days does he need to finish it? Show your work.",
        "Anna is {a} years old. Her father is {b} times as old as she is. How old is her father? Explain.",
        "A recipe needs {b} eggs for one cake. How many eggs are needed for {a} cakes? Show your work.",
        "There are {c} sweets shared equally among {b} children. How many does each child get? Explain your answer.",
        "A bus has {c} seats. {a} people get on at the first stop and {b} at the second. How many seats are still "
        "empty? Show the steps."]


def prompts(seed: int) -> list[tuple[str, str, bool]]:
    """(kind, text, chat) for the first round: everything but summarization and rag (their passages come from the
    target, see passage_prompts). chat: through the tokenizer's chat template, as eval sends the builtin set."""
    rng = random.Random(seed)
    out = []
    for activity in ACTIVITIES:
        out.append(("conversation", f"I want to get better at {activity}. Can you give me some practical tips?", True))
    for person, thing in zip(PEOPLE * 2, rng.sample(THINGS * 2, 20)):
        out.append(("conversation", f"Write a short, polite email to {person} about {thing}.", True))
    for form, theme in zip(rng.sample(FORMS * 3, 12), rng.sample(THEMES, 12)):
        out.append(("conversation", f"Write a {form} about {theme}.", True))
    for why in WHY:
        out.append(("conversation", f"Explain to a ten-year-old why {why}.", True))
    for topic in rng.sample(TOPICS, 12):
        out.append(("conversation", f"Pretend you are {topic.removeprefix('a ').removeprefix('an ')} and describe "
                                    f"your day.", True))
    for sentence in ENGLISH:
        language = rng.choice(["French", "German", "Spanish", "Italian"])
        out.append(("translation", f"Translate into {language}: {sentence}", True))
    for language, sentence in FOREIGN:
        out.append(("translation", f"Translate the following {language} sentence into English: {sentence}", True))
    for question in QUESTIONS:
        out.append(("qa", question, True))
    for template in MATH:
        for _ in range(4):
            a, b = rng.randint(3, 12), rng.randint(2, 9)
            c, p = rng.randint(a * b + 5, 300), rng.choice([10, 15, 20, 25, 30, 40, 50])
            out.append(("math", template.format(a=a, b=b, c=c, p=p), True))
    for opening in OPENINGS:
        out.append(("raw", opening, False))
    return out


def passage_prompts(seed: int) -> list[tuple[str, str, bool]]:
    rng = random.Random(seed + 1)
    kinds = ["a short news report", "a short article", "a short story", "a short notice"]
    return [("passage", f"Write {rng.choice(kinds)} about {topic}, in one paragraph.", True) for topic in TOPICS]


def quoting_prompts(passages: list[str], seed: int) -> list[tuple[str, str, bool]]:
    rng = random.Random(seed + 2)
    out = []
    for passage in passages:
        passage = passage.strip()
        if len(passage) < 80:
            continue
        out.append(("summarization", f"Summarize the following text in two sentences.\n\n{passage}", True))
        out.append(("rag", "Read the passage and answer the question using the passage.\n\nPassage: "
                           f"{passage}\n\nQuestion: {rng.choice(RAG_QUESTIONS)}", True))
    return out


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


@torch.inference_mode()
def generate(model, tokenizer, items, new_tokens: int, seed: int, batch: int = 16, temperatures=(0.0, 0.7),
             say=print, done: dict | None = None, keep=lambda: None) -> list[dict]:
    """Each prompt written out by the target once, the temperatures taken in turn (0: greedy): [{kind, ids,
    prompt_len}]. Each batch is seeded on its own and its texts go into `done` (batch key -> texts), `keep()` called
    after each: a run that was stopped starts again where it was (`done` read back), with the same texts."""
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    jobs = [(kind, encode(tokenizer, text, chat), temperatures[i % len(temperatures)])
            for i, (kind, text, chat) in enumerate(items)]
    jobs.sort(key=lambda job: len(job[1]))  # similar lengths together: little padding
    out, t0, done = [], time.perf_counter(), {} if done is None else done
    for first in range(0, len(jobs), batch):
        key = f"{seed}:{first}"
        if key in done:
            out.extend(done[key])
            continue
        torch.manual_seed(seed * 100_003 + first)
        group = jobs[first:first + batch]
        texts = []
        for temperature in sorted({t for _, _, t in group}):
            part = [job for job in group if job[2] == temperature]
            width = max(len(ids) for _, ids, _ in part)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids, _ in part])
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids, _ in part])
            config = GenerationConfig(max_new_tokens=new_tokens, do_sample=temperature > 0, pad_token_id=pad,
                                      eos_token_id=eos, temperature=temperature if temperature > 0 else None,
                                      top_k=None, top_p=None, repetition_penalty=None)
            result = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
            for (kind, ids, _), row in zip(part, result[:, width:].tolist()):
                if eos in row:
                    row = row[: row.index(eos) + 1]
                texts.append({"kind": kind, "ids": ids + row, "prompt_len": len(ids)})
        done[key] = texts
        out.extend(texts)
        keep()
        count = min(first + batch, len(jobs))
        elapsed = time.perf_counter() - t0
        say(f"  generated {count}/{len(jobs)} texts, {sum(len(r['ids']) - r['prompt_len'] for r in out)} new tokens, "
            f"{elapsed:.0f} s, about {elapsed / count * (len(jobs) - count):.0f} s left")
    return out


@torch.inference_mode()
def hidden_states(model, texts: list[dict], aux_layers, say=print, batch_tokens: int = 8192) -> list[dict]:
    """Per text: aux [T, 3H] float16 (the inputs of the aux layers), final [T, H] float16 (the final norm's output),
    argmax [T] (of the full logits at each position), by the target's forward over the texts, several at once (texts
    of similar length together, padded on the right: a causal forward's rows never see the padding after them)."""
    layers = model.model.layers
    captured: dict = {}
    hooks = [layers[i].register_forward_pre_hook(_grab(captured, i), with_kwargs=True) for i in aux_layers]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]["ids"]))
    groups, group = [], []
    for i in order:
        if group and (len(group) + 1) * len(texts[i]["ids"]) > batch_tokens:
            groups.append(group)
            group = []
        group.append(i)
    groups += [group] if group else []
    t0, finished = time.perf_counter(), 0
    try:
        for group in groups:
            width = max(len(texts[i]["ids"]) for i in group)
            ids = torch.tensor([texts[i]["ids"] + [0] * (width - len(texts[i]["ids"])) for i in group])
            final = model.model(input_ids=ids).last_hidden_state  # the final norm's output; its logits below
            rows = final.reshape(-1, final.shape[-1]).split(2048)
            argmax = torch.cat([model.get_output_embeddings()(r).argmax(-1) for r in rows]).view(final.shape[:2])
            for row, i in enumerate(group):
                n = len(texts[i]["ids"])
                texts[i]["aux"] = torch.cat([captured[a][row, :n] for a in aux_layers], dim=-1).half()
                texts[i]["final"] = final[row, :n].half()
                texts[i]["argmax"] = argmax[row, :n]
            finished += len(group)
            say(f"  hidden states of {finished}/{len(texts)} texts, {time.perf_counter() - t0:.0f} s")
    finally:
        for hook in hooks:
            hook.remove()
    return texts


def _grab(captured: dict, index: int):
    def hook(module, args, kwargs):
        captured[index] = args[0] if args else kwargs["hidden_states"]
    return hook
